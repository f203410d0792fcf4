// argocd-lua runs the resource customizations of a directory laid out as Argo CD's own
// resource_customizations (<group>/<Kind>/health.lua, health_test.yaml, actions/discovery.lua,
// actions/<name>/action.lua, actions/action_test.yaml, testdata/) through Argo CD's Lua code
// (github.com/argoproj/argo-cd/v3/util/lua, on gopher-lua), and checks every case of their
// test files:
//
//	argocd-lua DIR
//
// The scripts are handed to Argo CD as the resource overrides that argocd-cm's
// resource.customizations.health.<group>_<Kind> and resource.customizations.actions.<group>_<Kind>
// entries become, and run as the application controller (health) and the API server (action
// discovery, actions) run them: without Lua's open libraries, which argocd-cm grants a
// customization only when asked to. One line is printed per case; the exit status is 0 when every
// case matched, 1 when one did not, 2 when the directory or a test file could not be read.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	applicationpkg "github.com/argoproj/argo-cd/v3/pkg/apiclient/application"
	appv1 "github.com/argoproj/argo-cd/v3/pkg/apis/application/v1alpha1"
	argolua "github.com/argoproj/argo-cd/v3/util/lua"
)

// healthTests is health_test.yaml.
type healthTests struct {
	Tests []struct {
		InputPath    string `json:"inputPath"`
		HealthStatus struct {
			Status  string `json:"status"`
			Message string `json:"message"`
		} `json:"healthStatus"`
	} `json:"tests"`
}

// actionTests is actions/action_test.yaml.
type actionTests struct {
	DiscoveryTests []struct {
		InputPath string                 `json:"inputPath"`
		Result    []appv1.ResourceAction `json:"result"`
	} `json:"discoveryTests"`
	ActionTests []struct {
		Action               string            `json:"action"`
		InputPath            string            `json:"inputPath"`
		ExpectedOutputPath   string            `json:"expectedOutputPath"`
		ExpectedErrorMessage string            `json:"expectedErrorMessage"`
		Parameters           map[string]string `json:"parameters"`
	} `json:"actionTests"`
}

// customization is one <group>/<Kind> directory.
type customization struct {
	key string // "<group>/<Kind>", Argo CD's key for the resource overrides
	dir string
}

type run struct {
	overrides map[string]appv1.ResourceOverride
	cases     int
	failed    int
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: argocd-lua RESOURCE_CUSTOMIZATIONS_DIR")
		os.Exit(2)
	}
	if err := runAll(os.Args[1]); err != nil {
		fmt.Fprintf(os.Stderr, "argocd-lua: %v\n", err)
		os.Exit(2)
	}
}

func runAll(root string) error {
	customizations, err := find(root)
	if err != nil {
		return err
	}
	if len(customizations) == 0 {
		return fmt.Errorf("no health.lua or actions/discovery.lua under %s", root)
	}
	r := &run{overrides: map[string]appv1.ResourceOverride{}}
	for _, c := range customizations {
		override, err := load(c)
		if err != nil {
			return err
		}
		r.overrides[c.key] = override
	}
	fmt.Printf("argocd-lua: Argo CD %s, gopher-lua %s\n", moduleVersion("github.com/argoproj/argo-cd/v3"),
		moduleVersion("github.com/yuin/gopher-lua"))
	for _, c := range customizations {
		if r.overrides[c.key].HealthLua != "" {
			if err := r.health(c); err != nil {
				return err
			}
		}
		if r.overrides[c.key].Actions != "" {
			if err := r.actions(c); err != nil {
				return err
			}
		}
	}
	if r.cases == 0 {
		return errors.New("the test files hold no case")
	}
	fmt.Printf("argocd-lua: %d cases, %d mismatched\n", r.cases, r.failed)
	if r.failed > 0 {
		os.Exit(1)
	}
	return nil
}

// find lists the directories that hold a health check or actions, sorted.
func find(root string) ([]customization, error) {
	seen := map[string]bool{}
	var found []customization
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var dir string
		switch {
		case d.Name() == "health.lua":
			dir = filepath.Dir(path)
		case d.Name() == "discovery.lua" && filepath.Base(filepath.Dir(path)) == "actions":
			dir = filepath.Dir(filepath.Dir(path))
		default:
			return nil
		}
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if strings.Count(key, "/") != 1 {
			return fmt.Errorf("%s is not <group>/<Kind> under %s", dir, root)
		}
		if !seen[key] {
			seen[key] = true
			found = append(found, customization{key: key, dir: dir})
		}
		return nil
	})
	sort.Slice(found, func(i, j int) bool { return found[i].key < found[j].key })
	return found, err
}

// load reads a directory's scripts into the resource override argocd-cm's entries make of them.
func load(c customization) (appv1.ResourceOverride, error) {
	var override appv1.ResourceOverride
	if script, err := os.ReadFile(filepath.Join(c.dir, "health.lua")); err == nil {
		override.HealthLua = string(script)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return override, err
	}
	discovery, err := os.ReadFile(filepath.Join(c.dir, "actions", "discovery.lua"))
	if errors.Is(err, fs.ErrNotExist) {
		return override, nil
	} else if err != nil {
		return override, err
	}
	actions := appv1.ResourceActions{ActionDiscoveryLua: string(discovery)}
	entries, err := os.ReadDir(filepath.Join(c.dir, "actions"))
	if err != nil {
		return override, err
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		script, err := os.ReadFile(filepath.Join(c.dir, "actions", e.Name(), "action.lua"))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		} else if err != nil {
			return override, err
		}
		actions.Definitions = append(actions.Definitions, appv1.ResourceActionDefinition{Name: e.Name(), ActionLua: string(script)})
	}
	text, err := yaml.Marshal(actions)
	if err != nil {
		return override, err
	}
	override.Actions = string(text)
	return override, nil
}

func (r *run) health(c customization) error {
	var tests healthTests
	if err := readYAML(filepath.Join(c.dir, "health_test.yaml"), &tests); err != nil {
		return err
	}
	for _, test := range tests.Tests {
		name := fmt.Sprintf("health %s %s", c.key, test.InputPath)
		obj, err := object(c, test.InputPath)
		if err != nil {
			return err
		}
		want := fmt.Sprintf("%s %q", test.HealthStatus.Status, test.HealthStatus.Message)
		// The application controller's path: the resource overrides' health check, with the open
		// libraries only where the override asks for them.
		got, err := argolua.ResourceHealthOverrides(r.overrides).GetResourceHealth(obj)
		switch {
		case err != nil:
			r.result(name, false, fmt.Sprintf("error %v; want %s", err, want))
		case got == nil:
			r.result(name, false, fmt.Sprintf("no health check applies to %s; want %s", obj.GroupVersionKind(), want))
		default:
			seen := fmt.Sprintf("%s %q", got.Status, got.Message)
			if seen == want {
				r.result(name, true, seen)
			} else {
				r.result(name, false, fmt.Sprintf("got %s; want %s", seen, want))
			}
		}
	}
	return nil
}

func (r *run) actions(c customization) error {
	dir := filepath.Join(c.dir, "actions")
	var tests actionTests
	if err := readYAML(filepath.Join(dir, "action_test.yaml"), &tests); err != nil {
		return err
	}
	// The API server's path: a VM with the resource overrides and no open libraries.
	vm := argolua.VM{ResourceOverrides: r.overrides}
	for _, test := range tests.DiscoveryTests {
		name := fmt.Sprintf("discovery %s %s", c.key, test.InputPath)
		obj, err := object(customization{c.key, dir}, test.InputPath)
		if err != nil {
			return err
		}
		want := describeActions(test.Result)
		scripts, err := vm.GetResourceActionDiscovery(obj)
		if err != nil {
			r.result(name, false, fmt.Sprintf("error %v; want %s", err, want))
			continue
		}
		got, err := vm.ExecuteResourceActionDiscovery(obj, scripts)
		if err != nil {
			r.result(name, false, fmt.Sprintf("error %v; want %s", err, want))
			continue
		}
		// Argo CD's own test asks that each action offered is one of the result's; here the
		// offered actions must be the result's, all of them.
		seen := describeActions(got)
		if seen == want {
			r.result(name, true, seen)
		} else {
			r.result(name, false, fmt.Sprintf("got %s; want %s", seen, want))
		}
	}
	for _, test := range tests.ActionTests {
		name := fmt.Sprintf("action %s %s %s", c.key, test.Action, test.InputPath)
		obj, err := object(customization{c.key, dir}, test.InputPath)
		if err != nil {
			return err
		}
		action, err := vm.GetResourceAction(obj, test.Action)
		if err != nil {
			r.result(name, false, fmt.Sprintf("no action %q: %v", test.Action, err))
			continue
		}
		var params []*applicationpkg.ResourceActionParameters
		for k, v := range test.Parameters {
			params = append(params, &applicationpkg.ResourceActionParameters{Name: &k, Value: &v})
		}
		impacted, err := vm.ExecuteResourceAction(obj, action.ActionLua, params)
		if test.ExpectedErrorMessage != "" {
			switch {
			case err == nil:
				r.result(name, false, fmt.Sprintf("no error; want %q", test.ExpectedErrorMessage))
			case err.Error() != test.ExpectedErrorMessage:
				r.result(name, false, fmt.Sprintf("error %q; want %q", err, test.ExpectedErrorMessage))
			default:
				r.result(name, true, fmt.Sprintf("error %q", err))
			}
			continue
		}
		if err != nil {
			r.result(name, false, fmt.Sprintf("error %v", err))
			continue
		}
		expected, err := expectedObjects(filepath.Join(dir, test.ExpectedOutputPath))
		if err != nil {
			return err
		}
		if problem := compare(obj, impacted, expected); problem != "" {
			r.result(name, false, problem)
		} else {
			r.result(name, true, "matches "+test.ExpectedOutputPath)
		}
	}
	return nil
}

func (r *run) result(name string, ok bool, detail string) {
	r.cases++
	verdict := "ok  "
	if !ok {
		r.failed++
		verdict = "FAIL"
	}
	fmt.Printf("%s %s: %s\n", verdict, name, detail)
}

// object reads a test's input; its group and kind must be the directory's, or no script of the
// directory would apply to it.
func object(c customization, inputPath string) (*unstructured.Unstructured, error) {
	obj := map[string]any{}
	if err := readYAML(filepath.Join(c.dir, inputPath), &obj); err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: obj}
	if key := argolua.GetConfigMapKey(u.GroupVersionKind()); key != c.key {
		return nil, fmt.Errorf("%s: a %s in the directory of %s", filepath.Join(c.dir, inputPath), key, c.key)
	}
	return u, nil
}

// describeActions is the actions sorted by name, as JSON.
func describeActions(actions []appv1.ResourceAction) string {
	sorted := slices.Clone(actions)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	text, err := json.Marshal(sorted)
	if err != nil {
		return err.Error()
	}
	return string(text)
}

// expectedObjects reads an expected output: one object (a patch of the resource), or a list of
// {operation, unstructuredObj} as Argo CD's action tests write them.
func expectedObjects(path string) ([]map[string]any, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if bytes.HasPrefix(bytes.TrimSpace(text), []byte("-")) {
		var list []struct {
			UnstructuredObj map[string]any `json:"unstructuredObj"`
		}
		if err := yaml.Unmarshal(text, &list); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		objects := make([]map[string]any, 0, len(list))
		for _, item := range list {
			objects = append(objects, item.UnstructuredObj)
		}
		return objects, nil
	}
	obj := map[string]any{}
	if err := yaml.Unmarshal(text, &obj); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return []map[string]any{obj}, nil
}

// compare says how the resources an action returned differ from the expected ones, or "" when
// they are the same objects (numbers compared as JSON numbers: Lua has only floats).
func compare(source *unstructured.Unstructured, impacted []argolua.ImpactedResource, expected []map[string]any) string {
	if len(impacted) != len(expected) {
		return fmt.Sprintf("%d resources returned; want %d", len(impacted), len(expected))
	}
	for _, resource := range impacted {
		got := resource.UnstructuredObj
		if resource.K8SOperation == argolua.PatchOperation &&
			(got.GroupVersionKind() != source.GroupVersionKind() || got.GetName() != source.GetName() || got.GetNamespace() != source.GetNamespace()) {
			return fmt.Sprintf("a patch of %s %s, not of the resource", got.GroupVersionKind(), got.GetName())
		}
		var match map[string]any
		for _, want := range expected {
			w := unstructured.Unstructured{Object: want}
			if w.GroupVersionKind() == got.GroupVersionKind() && w.GetName() == got.GetName() && w.GetNamespace() == got.GetNamespace() {
				match = want
				break
			}
		}
		if match == nil {
			return fmt.Sprintf("%s %s is not in the expected output", got.GroupVersionKind(), got.GetName())
		}
		if d := differences("", asJSON(got.Object), asJSON(match)); len(d) > 0 {
			return fmt.Sprintf("the %s differs from the expected output:\n    %s", resource.K8SOperation, strings.Join(d, "\n    "))
		}
	}
	return ""
}

// differences lists where got and want differ, one "path: got X, want Y" each.
func differences(path string, got, want any) []string {
	g, gok := got.(map[string]any)
	w, wok := want.(map[string]any)
	if gok && wok {
		keys := map[string]bool{}
		for k := range g {
			keys[k] = true
		}
		for k := range w {
			keys[k] = true
		}
		var out []string
		for _, k := range slices.Sorted(maps.Keys(keys)) {
			gv, gin := g[k]
			wv, win := w[k]
			switch {
			case !gin:
				out = append(out, fmt.Sprintf("%s.%s: absent, want %s", path, k, show(wv)))
			case !win:
				out = append(out, fmt.Sprintf("%s.%s: %s, want it absent", path, k, show(gv)))
			default:
				out = append(out, differences(path+"."+k, gv, wv)...)
			}
		}
		return out
	}
	if reflect.DeepEqual(got, want) {
		return nil
	}
	return []string{fmt.Sprintf("%s: %s, want %s", path, show(got), show(want))}
}

func show(v any) string {
	text, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(text)
}

func asJSON(obj map[string]any) any {
	text, err := json.Marshal(obj)
	if err != nil {
		return err.Error()
	}
	var v any
	if err := json.Unmarshal(text, &v); err != nil {
		return err.Error()
	}
	return v
}

func readYAML(path string, into any) error {
	text, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := yaml.UnmarshalStrict(text, into); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// moduleVersion is the version of a module linked into this program.
func moduleVersion(path string) string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	for _, m := range info.Deps {
		if m.Path == path {
			if m.Replace != nil {
				return m.Replace.Version
			}
			return m.Version
		}
	}
	return "(not linked)"
}
