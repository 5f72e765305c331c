package ollamastore

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

func TestValidateName(t *testing.T) {
	valid := []string{
		"tiny-chat", "Llama-3.2-1B-Instruct", "_x", "qwen3:0.6b", "meta-llama/Llama-3.2-1B", "my_org/m:v1.2-rc",
		"registry.example.com:5000/ns/m:tag", "h/ns/m", "a:/ns/m", strings.Repeat("m", 80), strings.Repeat("h", 350) + "/n/m",
	}
	invalid := map[string]string{
		"":                                "it is empty",
		"Tiny Chat":                       `its model "Tiny Chat" holds ' '`,
		"-chat":                           `its model "-chat" starts with '-'`,
		".chat":                           `starts with '.'`,
		"m:":                              `its tag "" is empty`,
		"m:-x":                            `its tag "-x" starts with '-'`,
		"a:b:c":                           `its model "a:b" holds ':'`,
		"my.org/m":                        `its namespace "my.org" holds '.'`,
		"/m":                              `its namespace "" is empty`,
		"a/b/c/d":                         "it has 4 parts separated by '/'",
		"http://h/n/m":                    `it holds "://"`,
		"m@sha256:00":                     `holds '@'`,
		"modèle":                          `holds 'è'`,
		strings.Repeat("m", 81):           "is 81 characters long",
		"h:/n/" + strings.Repeat("t", 81): "is 81 characters long",
	}
	re := regexp.MustCompile(NamePattern)
	for _, s := range valid {
		if err := ValidateName(s); err != nil {
			t.Errorf("ValidateName(%q) = %v, want nil", s, err)
		}
		if !re.MatchString(s) {
			t.Errorf("NamePattern does not match the valid %q", s)
		}
	}
	for s, want := range invalid {
		if err := ValidateName(s); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ValidateName(%q) = %v, want an error with %q", s, err, want)
		}
		if re.MatchString(s) {
			t.Errorf("NamePattern matches the invalid %q", s)
		}
	}
	// NamePattern and ValidateName agree on random names.
	r := rand.New(rand.NewPCG(1, 2))
	const alphabet = "aZ9_-.:/ @"
	for range 200000 {
		b := make([]byte, r.IntN(9))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		s := string(b)
		if err := ValidateName(s); (err == nil) != re.MatchString(s) {
			t.Fatalf("%q: ValidateName says %v, NamePattern matches: %v", s, err, re.MatchString(s))
		}
	}
}
