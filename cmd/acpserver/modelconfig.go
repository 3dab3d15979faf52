package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
)

// modelConfigKeys maps the "model" section of the config file to flags.
var modelConfigKeys = map[string]string{
	"name":             "model",
	"baseURL":          "model-base-url",
	"apiKeyEnv":        "model-api-key-env",
	"timeout":          "model-timeout",
	"maxTokens":        "model-max-tokens",
	"maxTurnRequests":  "max-turn-requests",
	"retries":          "model-retries",
	"permissionPolicy": "permission-policy",
	"allowTools":       "allow-tools",
	"systemPrompt":     "model-system-prompt",
	"contextWindow":    "model-context-window",
}

// applyModelConfig gives the model flags the values of the config file's
// "model" section, except where the command line or the environment set
// them: command line > environment > config file > default.
func applyModelConfig(fs *flag.FlagSet, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	var fc struct {
		Model map[string]json.RawMessage `json:"model"`
	}
	if err := json.Unmarshal(b, &fc); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	userSet := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { userSet[f.Name] = true })
	keys := make([]string, 0, len(fc.Model))
	for k := range fc.Model {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		name, ok := modelConfigKeys[k]
		if !ok {
			return fmt.Errorf("config %s: unknown key model.%s", path, k)
		}
		if _, inEnv := os.LookupEnv(envName(name)); userSet[name] || inEnv {
			continue
		}
		v, err := configValue(fc.Model[k])
		if err != nil {
			return fmt.Errorf("config %s: model.%s: %w", path, k, err)
		}
		if err := fs.Lookup(name).Value.Set(v); err != nil {
			return fmt.Errorf("config %s: model.%s: %w", path, k, err)
		}
	}
	return nil
}

// configValue renders a JSON string, number, boolean or list of strings as
// the text its flag parses.
func configValue(raw json.RawMessage) (string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var list []string
	if json.Unmarshal(raw, &list) == nil {
		return strings.Join(list, ","), nil
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String(), nil
	}
	var bl bool
	if json.Unmarshal(raw, &bl) == nil {
		return fmt.Sprint(bl), nil
	}
	return "", fmt.Errorf("want a string, number, boolean or list of strings, got %s", raw)
}
