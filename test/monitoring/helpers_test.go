package monitoring

import (
	"bytes"
	"strings"
)

func contains(b []byte, s string) bool { return bytes.Contains(b, []byte(s)) }

func lower(s string) string { return strings.ToLower(s) }
