package argocd

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	lua "github.com/yuin/gopher-lua"
	luajson "layeh.com/gopher-json"
)

// The Lua runtime as Argo CD runs resource customizations (argo-cd
// util/lua/lua.go, runLua, with gopher-lua v1.1.2 and layeh.com/gopher-json,
// the versions its go.mod names): a state opened without the standard
// libraries unless useOpenLibs, then package, base and table opened, and a
// "safe" os of only time and date. Argo CD registers that os module under the
// name of the table library, so the global os stays unset in the sandbox and a
// script reaches it only through require("os") (which its preload serves);
// this runtime does the same, so a script that calls os.date without
// require fails here as it would there. The object is the global obj, action
// parameters the global actionParams, and a script has one second.
//
// useOpenLibs is true for Argo CD's built-in scripts and for an argocd-cm
// health check with resource.customizations.useOpenLibs.<group_kind> set;
// actions always run without it (the API server's VM leaves it unset).

// healthStatus is Argo CD's health.HealthStatus as a script returns it.
type healthStatus struct {
	Status  string `json:"status,omitempty"`
	Message string `json:"message,omitempty"`
}

// resourceAction is an entry of an action discovery's result (Argo CD's
// ResourceAction, without params).
type resourceAction struct {
	Name        string `json:"name"`
	Disabled    bool   `json:"disabled,omitempty"`
	IconClass   string `json:"iconClass,omitempty"`
	DisplayName string `json:"displayName,omitempty"`
}

// runLua runs script on obj as Argo CD does and returns the JSON of the table
// it returns.
func runLua(obj map[string]any, script string, useOpenLibs bool) ([]byte, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: !useOpenLibs})
	defer l.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
		{lua.OsLibName, openSafeOS},
	} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name)); err != nil {
			return nil, err
		}
	}
	l.PreloadModule(lua.OsLibName, func(l *lua.LState) int {
		l.Push(l.SetFuncs(l.NewTable(), safeOSFuncs))
		return 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("actionParams", l.CreateTable(0, 0))
	l.SetGlobal("obj", toLua(l, obj))
	if err := l.DoString(script); err != nil {
		return nil, err
	}
	ret := l.Get(-1)
	if ret.Type() != lua.LTTable {
		return nil, fmt.Errorf("expect table output from Lua script, not %s", ret.Type())
	}
	return luajson.Encode(ret)
}

// health runs a health script: a status outside Argo CD's set is Unknown.
func health(obj map[string]any, script string, useOpenLibs bool) (healthStatus, error) {
	out, err := runLua(obj, script, useOpenLibs)
	if err != nil {
		return healthStatus{}, err
	}
	var hs healthStatus
	if err := json.Unmarshal(out, &hs); err != nil {
		return healthStatus{}, fmt.Errorf("health script returned %s: %w", out, err)
	}
	switch hs.Status {
	case "Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown":
		return hs, nil
	}
	return healthStatus{Status: "Unknown", Message: "Lua returned an invalid health status"}, nil
}

// discover runs an action discovery script, in the sandbox.
func discover(obj map[string]any, script string) (map[string]resourceAction, error) {
	out, err := runLua(obj, script, false)
	if err != nil {
		return nil, err
	}
	actions := map[string]resourceAction{}
	if string(out) == "[]" { // an empty table: no actions
		return actions, nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(out, &raw); err != nil {
		return nil, fmt.Errorf("discovery returned %s: %w", out, err)
	}
	for name, v := range raw {
		a := resourceAction{Name: name}
		if string(v) != "[]" { // an empty table: the action, enabled
			if err := json.Unmarshal(v, &a); err != nil {
				return nil, fmt.Errorf("action %s: %w", name, err)
			}
			a.Name = name
		}
		actions[name] = a
	}
	return actions, nil
}

// act runs an action script, in the sandbox, and returns the object to patch
// with, cleaned as Argo CD cleans it: an empty table where the object had a
// map becomes that map again.
func act(obj map[string]any, script string) (map[string]any, error) {
	out, err := runLua(obj, script, false)
	if err != nil {
		return nil, err
	}
	if strings.HasPrefix(string(out), "[") {
		return nil, fmt.Errorf("action returned a list of impacted resources, which these actions never do: %s", out)
	}
	var newObj map[string]any
	if err := json.Unmarshal(out, &newObj); err != nil {
		return nil, err
	}
	return restoreEmptyMaps(newObj, obj), nil
}

// restoreEmptyMaps puts back the maps of old that the Lua round trip turned
// into empty lists (Lua has one kind of table, and an empty one encodes as []).
func restoreEmptyMaps(new, old map[string]any) map[string]any {
	for k, nv := range new {
		ov, ok := old[k]
		if !ok {
			continue
		}
		switch n := nv.(type) {
		case map[string]any:
			if o, ok := ov.(map[string]any); ok {
				new[k] = restoreEmptyMaps(n, o)
			}
		case []any:
			switch o := ov.(type) {
			case map[string]any:
				if len(n) == 0 {
					new[k] = o
				}
			case []any:
				for i := range n {
					if i >= len(o) {
						break
					}
					nm, ok1 := n[i].(map[string]any)
					om, ok2 := o[i].(map[string]any)
					if ok1 && ok2 {
						n[i] = restoreEmptyMaps(nm, om)
					}
				}
			}
		}
	}
	return new
}

// toLua turns a decoded object into Lua values as Argo CD does: numbers of
// any Go type become numbers, json.Number a string, anything else nil.
func toLua(l *lua.LState, v any) lua.LValue {
	switch x := v.(type) {
	case bool:
		return lua.LBool(x)
	case string:
		return lua.LString(x)
	case float64:
		return lua.LNumber(x)
	case int:
		return lua.LNumber(x)
	case int32:
		return lua.LNumber(x)
	case int64:
		return lua.LNumber(x)
	case json.Number:
		return lua.LString(x)
	case []any:
		t := l.CreateTable(len(x), 0)
		for _, item := range x {
			t.Append(toLua(l, item))
		}
		return t
	case map[string]any:
		t := l.CreateTable(0, len(x))
		for k, item := range x {
			t.RawSetH(lua.LString(k), toLua(l, item))
		}
		return t
	}
	return lua.LNil
}

// safeOSFuncs are the os functions Argo CD lets scripts have.
var safeOSFuncs = map[string]lua.LGFunction{"time": osTime, "date": osDate}

// openSafeOS registers the safe functions as Argo CD's OpenSafeOs does: into
// the module named after the table library, leaving the global os unset.
func openSafeOS(l *lua.LState) int {
	l.Push(l.RegisterModule(lua.TabLibName, safeOSFuncs))
	return 1
}

// osTime is os.time: now, or the time of a table {year, month, day, hour, min, sec}.
func osTime(l *lua.LState) int {
	if l.GetTop() == 0 {
		l.Push(lua.LNumber(time.Now().Unix()))
		return 1
	}
	tbl := l.CheckTable(1)
	field := func(name string, def int) int {
		if n, ok := tbl.RawGetString(name).(lua.LNumber); ok {
			return int(n)
		}
		return def
	}
	t := time.Date(field("year", -1), time.Month(field("month", -1)), field("day", -1),
		field("hour", 12), field("min", 0), field("sec", 0), 0, time.Local)
	l.Push(lua.LNumber(t.Unix()))
	return 1
}

// osDate is os.date([format [, time]]): "!" first means UTC; "*t" a table;
// otherwise strftime's conversions, those Argo CD's version knows.
func osDate(l *lua.LState) int {
	t, format := time.Now(), "%c"
	if l.GetTop() >= 1 {
		format = l.CheckString(1)
		if rest, ok := strings.CutPrefix(format, "!"); ok {
			t, format = t.UTC(), rest
		}
		if l.GetTop() >= 2 {
			t = time.Unix(l.CheckInt64(2), 0)
		}
		if strings.HasPrefix(format, "*t") {
			tbl := l.NewTable()
			for k, v := range map[string]int{"year": t.Year(), "month": int(t.Month()), "day": t.Day(),
				"hour": t.Hour(), "min": t.Minute(), "sec": t.Second(), "wday": int(t.Weekday()) + 1, "yday": 0} {
				tbl.RawSetString(k, lua.LNumber(v))
			}
			tbl.RawSetString("isdst", lua.LFalse)
			l.Push(tbl)
			return 1
		}
	}
	l.Push(lua.LString(strftime(t, format)))
	return 1
}

// strftimeLayouts are the conversions and their Go layouts.
var strftimeLayouts = map[byte]string{
	'a': "Mon", 'A': "Monday", 'b': "Jan", 'B': "January", 'c': "02 Jan 06 15:04 MST", 'd': "02",
	'F': "2006-01-02", 'H': "15", 'I': "03", 'm': "01", 'M': "04", 'p': "PM", 'P': "pm", 'S': "05",
	'X': "15:04:05", 'y': "06", 'Y': "2006", 'z': "-0700", 'Z': "MST",
}

func strftime(t time.Time, format string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i == len(format)-1 {
			b.WriteByte(c)
			continue
		}
		i++
		switch c = format[i]; {
		case c == '%':
			b.WriteByte('%')
		case c == 'w':
			b.WriteString(strconv.Itoa(int(t.Weekday())))
		case strftimeLayouts[c] != "":
			b.WriteString(t.Format(strftimeLayouts[c]))
		default:
			b.WriteByte('%')
			b.WriteByte(c)
		}
	}
	return b.String()
}
