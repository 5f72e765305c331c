package ollamastore

import (
	"fmt"
	"strings"
)

// NamePattern matches exactly the served names ValidateName accepts, for
// admission to refuse the others before a pod is made: [[host/]namespace/]model[:tag].
const NamePattern = `^(?:(?:[A-Za-z0-9_][A-Za-z0-9_.:-]{0,349}/)?[A-Za-z0-9_][A-Za-z0-9_-]{0,79}/)?[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,79})?$`

// Ollama's defaults for the parts a short name leaves out (types/model.DefaultName).
const (
	defaultHost      = "registry.ollama.ai"
	defaultNamespace = "library"
	defaultTag       = "latest"
)

// name is a served name with Ollama's defaults filled in; its parts are the
// folders of its manifest under manifests/.
type name struct{ host, namespace, model, tag string }

func (n name) path() []string { return []string{n.host, n.namespace, n.model, n.tag} }

// ValidateName reports why Ollama would refuse s as a model name, or nil;
// NamePattern matches the same names.
// It follows Ollama v0.9.6's types/model.ParseName and Name.IsValid, except
// that it also refuses a "scheme://" prefix, which ParseName drops: clients
// send the served name as it is, and a URL is no model name.
func ValidateName(s string) error {
	_, err := parseName(s)
	return err
}

func parseName(s string) (name, error) {
	n := name{host: defaultHost, namespace: defaultNamespace, tag: defaultTag}
	invalid := func(format string, args ...any) (name, error) {
		return name{}, fmt.Errorf("served model name %q is not a name Ollama accepts: %s; the form is [[host/]namespace/]model[:tag]",
			s, fmt.Sprintf(format, args...))
	}
	if s == "" {
		return invalid("it is empty")
	}
	if strings.Contains(s, "://") {
		return invalid(`it holds "://": a URL is no model name`)
	}
	rest := s
	// A colon after the last slash starts the tag; one before it is a host's port.
	if i := strings.LastIndex(s, ":"); i > strings.LastIndex(s, "/") {
		rest, n.tag = s[:i], s[i+1:]
	}
	parts := strings.Split(rest, "/")
	switch len(parts) {
	case 1:
		n.model = parts[0]
	case 2:
		n.namespace, n.model = parts[0], parts[1]
	case 3:
		n.host, n.namespace, n.model = parts[0], parts[1], parts[2]
	default:
		return invalid("it has %d parts separated by '/', at most 3 are allowed", len(parts))
	}
	for _, p := range []struct {
		kind, value, extra string
		max                int
	}{
		{"host", n.host, ".:", 350},
		{"namespace", n.namespace, "", 80},
		{"model", n.model, ".", 80},
		{"tag", n.tag, ".", 80},
	} {
		if reason := checkPart(p.value, p.extra, p.max); reason != "" {
			return invalid("its %s %q %s (a %s is 1 to %d letters, digits, %s, starting with a letter, digit or '_')",
				p.kind, p.value, reason, p.kind, p.max, quoteAll("_-"+p.extra))
		}
	}
	return n, nil
}

// checkPart says what is wrong with one part of a name: its length, or a
// character other than letters, digits, '_', '-' and those in extra.
func checkPart(s, extra string, maxLen int) string {
	switch {
	case s == "":
		return "is empty"
	case len(s) > maxLen:
		return fmt.Sprintf("is %d characters long", len(s))
	}
	for i, c := range s {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' {
			continue
		}
		if i == 0 {
			return fmt.Sprintf("starts with %q", c)
		}
		if c != '-' && !strings.ContainsRune(extra, c) {
			return fmt.Sprintf("holds %q", c)
		}
	}
	return ""
}

// quoteAll lists chars as '_', '-' and '.'.
func quoteAll(chars string) string {
	var quoted []string
	for _, c := range chars {
		quoted = append(quoted, fmt.Sprintf("'%c'", c))
	}
	last := len(quoted) - 1
	return strings.Join(quoted[:last], ", ") + " and " + quoted[last]
}
