package karmada

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"time"

	lua "github.com/yuin/gopher-lua"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	luajson "layeh.com/gopher-json"
)

// A stand-in for Karmada's Lua VM (karmada pkg/resourceinterpreter/customized/
// declarative/luavm), written from its source, as the engine cannot be
// fetched here. What it reproduces:
//   - the state: Lua's standard libraries skipped, then package (with only the
//     preload loader, and loadlib refused), base, table, string and math
//     opened; the base functions Karmada disables (collectgarbage, dofile,
//     getfenv, getmetatable, load, loadfile, loadstring, rawequal, rawget,
//     rawset, setfenv, setmetatable, module, newproxy) replaced by functions
//     that raise an error;
//   - a script has one second; it is loaded, then the function of its name
//     is called with the arguments, each turned into Lua through JSON;
//   - results are turned back through JSON as its ConvertLuaResultInto does,
//     empty tables included (see convertInto).
//
// What it leaves out, because the scripts use none of it: Karmada's safe os
// (time and date) and string library (gopher-lua's string library stands in;
// Karmada's caps the length of its arguments), and its kube library
// (accuratePodRequirements, getPodDependencies, resourceAdd,
// getResourceQuantity), reachable with require("kube"). TestSandbox checks
// that the scripts require nothing.
//
// Karmada builds with gopher-lua v1.1.1 and layeh.com/gopher-json of
// 2020-11-24; this module has gopher-lua v1.1.2 and gopher-json of
// 2019-01-14, whose encoder is the same.

// disabledBaseFuncs are the base functions Karmada's VM replaces by errors.
var disabledBaseFuncs = []string{"collectgarbage", "dofile", "getfenv", "getmetatable", "load", "loadfile",
	"loadstring", "rawequal", "rawget", "rawset", "setfenv", "setmetatable", "module", "newproxy"}

// newState is a Lua state set up as Karmada's VM sets one up.
func newState() (*lua.LState, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{
		{lua.LoadLibName, openPreloadOnlyPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
		{lua.StringLibName, lua.OpenString},
		{lua.MathLibName, lua.OpenMath},
	} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name)); err != nil {
			l.Close()
			return nil, err
		}
	}
	for _, name := range disabledBaseFuncs {
		if err := l.DoString(fmt.Sprintf("function %s() error('call function %s is not supported in karmada customized resourceinterpreter.') end", name, name)); err != nil {
			l.Close()
			return nil, err
		}
	}
	return l, nil
}

// openPreloadOnlyPackage opens gopher-lua's package library, then leaves
// require only the preload loader (no loading from files) and makes loadlib
// an error, as Karmada's safe package library does.
func openPreloadOnlyPackage(l *lua.LState) int {
	lua.OpenPackage(l)
	pkg := l.Get(-1).(*lua.LTable)
	loaders := l.GetField(pkg, "loaders").(*lua.LTable)
	preloadOnly := l.CreateTable(1, 0)
	preloadOnly.Append(loaders.RawGetInt(1))
	l.SetField(pkg, "loaders", preloadOnly)
	l.SetField(l.Get(lua.RegistryIndex), "_LOADERS", preloadOnly)
	l.SetField(pkg, "loadlib", l.NewFunction(func(l *lua.LState) int {
		l.RaiseError("loadlib is not supported")
		return 0
	}))
	return 1
}

// runScript loads script and calls its function fn with args, as Karmada's
// RunScript does, returning nRets results.
func runScript(script, fn string, nRets int, args ...any) ([]lua.LValue, error) {
	l, err := newState()
	if err != nil {
		return nil, err
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	if err := l.DoString(script); err != nil {
		return nil, err
	}
	values := make([]lua.LValue, len(args))
	for i, arg := range args {
		if values[i], err = toLua(l, arg); err != nil {
			return nil, err
		}
	}
	f := l.GetGlobal(fn)
	if f.Type() != lua.LTFunction {
		return nil, fmt.Errorf("not found function %v", fn)
	}
	if err := l.CallByParam(lua.P{Fn: f, NRet: nRets, Protect: true}, values...); err != nil {
		return nil, err
	}
	rets := make([]lua.LValue, nRets)
	for i := range rets {
		rets[i] = l.Get(i + 1)
	}
	return rets, nil
}

// toLua turns an argument into Lua as Karmada's decodeValue does: numbers
// directly, anything else (an object, the status items) through JSON.
func toLua(l *lua.LState, v any) (lua.LValue, error) {
	switch x := v.(type) {
	case int64:
		return lua.LNumber(x), nil
	case int32:
		return lua.LNumber(x), nil
	}
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return luajson.Decode(l, data)
}

// convertInto turns a table a script returned into obj as Karmada's
// ConvertLuaResultInto does. Lua has one kind of table, and an empty one
// encodes as []: a whole result of [] becomes {} when obj is a struct; an
// empty list inside becomes {} where the references (the objects the script
// was given) have an empty map at that path (list indices left out), stays
// where they have an empty list, and is deleted otherwise.
func convertInto(t lua.LValue, obj any, references ...any) error {
	table, ok := t.(*lua.LTable)
	if !ok {
		return fmt.Errorf("expect a table, got %s", t.Type())
	}
	data, err := luajson.Encode(table)
	if err != nil {
		return fmt.Errorf("encode lua result to json failed: %w", err)
	}
	if bytes.Equal(data, []byte("[]")) {
		if reflect.ValueOf(obj).Elem().Kind() == reflect.Struct {
			data = []byte("{}")
		}
		return json.Unmarshal(data, obj)
	}
	emptyLists, emptyMaps := map[string]bool{}, map[string]bool{}
	for _, ref := range references {
		b, err := json.Marshal(ref)
		if err != nil {
			return err
		}
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			return err
		}
		findEmpty(v, "", emptyLists, emptyMaps)
	}
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	v = fixEmpty(v, "", emptyLists, emptyMaps)
	if data, err = json.Marshal(v); err != nil {
		return err
	}
	return json.Unmarshal(data, obj)
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// findEmpty records the paths of empty lists and maps in v.
func findEmpty(v any, path string, emptyLists, emptyMaps map[string]bool) {
	switch x := v.(type) {
	case map[string]any:
		for k, item := range x {
			p := joinPath(path, k)
			switch y := item.(type) {
			case []any:
				if len(y) == 0 {
					emptyLists[p] = true
					continue
				}
			case map[string]any:
				if len(y) == 0 {
					emptyMaps[p] = true
					continue
				}
			}
			findEmpty(item, p, emptyLists, emptyMaps)
		}
	case []any:
		for _, item := range x {
			findEmpty(item, path, emptyLists, emptyMaps)
		}
	}
}

// fixEmpty turns the empty lists of v into maps or drops them, as above.
func fixEmpty(v any, path string, emptyLists, emptyMaps map[string]bool) any {
	switch x := v.(type) {
	case map[string]any:
		for k, item := range x {
			p := joinPath(path, k)
			if l, ok := item.([]any); ok && len(l) == 0 {
				switch {
				case emptyMaps[p]:
					x[k] = map[string]any{}
				case !emptyLists[p]:
					delete(x, k)
				}
				continue
			}
			x[k] = fixEmpty(item, p, emptyLists, emptyMaps)
		}
	case []any:
		for i, item := range x {
			if l, ok := item.([]any); ok && len(l) == 0 {
				continue
			}
			x[i] = fixEmpty(item, path, emptyLists, emptyMaps)
		}
	}
	return v
}

// The JSON shapes Karmada decodes the results into (karmada
// pkg/apis/work/v1alpha2), for the fields these scripts fill.

// replicaRequirements is Karmada's ReplicaRequirements.
type replicaRequirements struct {
	NodeClaim         *nodeClaim          `json:"nodeClaim,omitempty"`
	ResourceRequest   corev1.ResourceList `json:"resourceRequest,omitempty"`
	Namespace         string              `json:"namespace,omitempty"`
	PriorityClassName string              `json:"priorityClassName,omitempty"`
}

// nodeClaim is Karmada's NodeClaim.
type nodeClaim struct {
	HardNodeAffinity *corev1.NodeSelector `json:"hardNodeAffinity,omitempty"`
	NodeSelector     map[string]string    `json:"nodeSelector,omitempty"`
	Tolerations      []corev1.Toleration  `json:"tolerations,omitempty"`
}

// aggregatedStatusItem is Karmada's AggregatedStatusItem: one member
// cluster's reflected status, as AggregateStatus receives it.
type aggregatedStatusItem struct {
	ClusterName    string          `json:"clusterName"`
	Status         json.RawMessage `json:"status,omitempty"`
	Applied        bool            `json:"applied,omitempty"`
	AppliedMessage string          `json:"appliedMessage,omitempty"`
	Health         string          `json:"health,omitempty"`
}

// The interpreter's operations, as Karmada's VM runs them.

func getReplicas(script string, obj *unstructured.Unstructured) (int32, *replicaRequirements, error) {
	rets, err := runScript(script, "GetReplicas", 2, obj)
	if err != nil {
		return 0, nil, err
	}
	n, ok := rets[0].(lua.LNumber)
	if !ok {
		return 0, nil, fmt.Errorf("result type %s is not number", rets[0].Type())
	}
	switch rets[1].Type() {
	case lua.LTNil:
		return int32(n), nil, nil
	case lua.LTTable:
		req := &replicaRequirements{}
		if err := convertInto(rets[1], req); err != nil {
			return 0, nil, err
		}
		return int32(n), req, nil
	}
	return 0, nil, fmt.Errorf("expect the returned requires type is table but got %s", rets[1].Type())
}

func reviseReplica(script string, obj *unstructured.Unstructured, replicas int64) (*unstructured.Unstructured, error) {
	rets, err := runScript(script, "ReviseReplica", 1, obj, replicas)
	if err != nil {
		return nil, err
	}
	out := &unstructured.Unstructured{}
	return out, convertInto(rets[0], out, obj)
}

func reflectStatus(script string, obj *unstructured.Unstructured) (map[string]any, error) {
	rets, err := runScript(script, "ReflectStatus", 1, obj)
	if err != nil {
		return nil, err
	}
	raw := &runtime.RawExtension{}
	if err := convertInto(rets[0], raw); err != nil {
		return nil, err
	}
	status := map[string]any{}
	return status, json.Unmarshal(raw.Raw, &status)
}

func aggregateStatus(script string, obj *unstructured.Unstructured, items []aggregatedStatusItem) (*unstructured.Unstructured, error) {
	rets, err := runScript(script, "AggregateStatus", 1, obj, items)
	if err != nil {
		return nil, err
	}
	out := &unstructured.Unstructured{}
	return out, convertInto(rets[0], out)
}

func interpretHealth(script string, obj *unstructured.Unstructured) (bool, error) {
	rets, err := runScript(script, "InterpretHealth", 1, obj)
	if err != nil {
		return false, err
	}
	b, ok := rets[0].(lua.LBool)
	if !ok {
		return false, fmt.Errorf("result type %s is not bool", rets[0].Type())
	}
	return bool(b), nil
}

// errorContains is true when err says want.
func errorContains(err error, want string) bool {
	return err != nil && strings.Contains(err.Error(), want)
}
