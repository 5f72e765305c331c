package docscheck

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/aiinference/operator/internal/kubectlaii"
	"github.com/aiinference/operator/internal/loader"
	"github.com/aiinference/operator/internal/reasons"
	"github.com/aiinference/operator/internal/router"
	"github.com/aiinference/operator/internal/warmup"
)

// root is the repository's root, from this package's folder.
var root = filepath.Join("..", "..")

// externalFlags are flags the docs name of other programs: the engines (the
// args a spec passes), Kubernetes' own binaries, kubectl, and the tools the
// benchmarks run. A flag of the docs that is neither one of ours nor here is
// a mistake.
var externalFlags = map[string]string{
	"endpoint-reconciler-type":     "kube-apiserver",
	"runtime-config":               "kube-apiserver",
	"hostname-override":            "kubelet",
	"cleanup":                      "kube-proxy",
	"for":                          "kubectl wait",
	"overwrite":                    "kubectl annotate",
	"strict":                       "promtool",
	"force-dummy-tokenizer":        "llm-d-inference-sim",
	"enable-kvcache":               "llm-d-inference-sim",
	"kv-cache-size":                "llm-d-inference-sim",
	"max-num-seqs":                 "vLLM, llm-d-inference-sim",
	"time-factor-under-load":       "llm-d-inference-sim",
	"served-model-name":            "vLLM, llm-d-inference-sim",
	"tensor-parallel-size":         "vLLM",
	"pipeline-parallel-size":       "vLLM",
	"distributed-executor-backend": "vLLM",
	"max-num-batched-tokens":       "vLLM",
	"port":                         "vLLM, llm-d-inference-sim",
	"model":                        "vLLM, llm-d-inference-sim",
	"model-id":                     "TGI",
	"num-shard":                    "TGI",
	"model-repository":             "Triton",
	"model-store":                  "Triton",
	"http-port":                    "Triton",
	"metrics-config":               "Triton",
	"transfers":                    "rclone",
	"multi-thread-streams":         "rclone",
	"multi-thread-chunk-size":      "rclone",
	"profiling":                    "kube-apiserver",
	"take-ownership":               "helm install",
	"enable-lora":                  "vLLM",
	"max-loras":                    "vLLM, llm-d-inference-sim",
	"max-cpu-loras":                "vLLM, llm-d-inference-sim",
	"max-lora-rank":                "vLLM",
	"ray":                          "vLLM's multi-node-serving.sh (--ray_cluster_size, --ray_address)",
	"cluster-failure-threshold":    "karmada-controller-manager",
}

// externalWords are PascalCase words the docs write as code that are not the
// operator's: Kubernetes kinds, the kubelet's and controllers' reasons, values
// of Kubernetes fields, Go and OTLP names.
var externalWords = []string{
	"Service", "PodMonitor", "InferencePool", "IfNotPresent", "GuaranteedUpdate",
	"ExportTraceServiceRequest", "VmHWM", "GOGC", "GOMEMLIMIT", "HOME", "False", "Fail",
	"CRDValidationRatcheting", "ConvertLuaResultInto",
	"Failover",                  // Karmada's feature gate
	"RecreateGroupOnPodRestart", // LeaderWorkerSet's restart policy
}

// docs are README.md and docs/*.md, by their path from the root.
func docs(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, f := range append(files, filepath.Join(root, "README.md")) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		out[rel] = string(data)
	}
	return out
}

var (
	// A fence may be indented, as in a list item.
	fence    = regexp.MustCompile("(?ms)^[ \t]*```[^\n]*\n.*?^[ \t]*```")
	codeSpan = regexp.MustCompile("`([^`]+)`") // may go on over a line break
	flagRef  = regexp.MustCompile(`(?:^|[\s"'(=])--([a-z][a-z0-9-]*[a-z0-9*])`)
	// Where a line runs one of the binaries whose flags are checked.
	invocations = map[string]*regexp.Regexp{
		"manager":      regexp.MustCompile(`(?:bin/manager|cmd/manager|^manager)\b(.*)`),
		"model-loader": regexp.MustCompile(`\bmodel-loader\b( .*)`),
		"warmup":       regexp.MustCompile(`\bmodel-loader warmup\b(.*)`),
		"kubectl-aii":  regexp.MustCompile(`\bkubectl[ -]aii\b(.*)`),
		"router":       regexp.MustCompile(`(?:bin/router|cmd/router|^router)\b(.*)`),
		"ollama-start": regexp.MustCompile(`(?:/ollama-start|cmd/ollama-start|^ollama-start)\b(.*)`),
	}
	pascal = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*$`)
)

// flagsOfUsage reads the flag names from a Go flag package's usage text.
func flagsOfUsage(usage string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^  -([A-Za-z0-9][\w.-]*)`).FindAllStringSubmatch(usage, -1) {
		out = append(out, m[1])
	}
	return out
}

// ourFlags are the flags of each binary, from their own flag sets.
func ourFlags(t *testing.T) map[string][]string {
	t.Helper()
	flags := map[string][]string{}

	// The manager and ollama-start are main packages: build each and read its -h.
	for _, name := range []string{"manager", "ollama-start"} {
		bin := filepath.Join(t.TempDir(), name)
		build := exec.Command("go", "build", "-o", bin, "./cmd/"+name)
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", name, err, out)
		}
		usage, _ := exec.Command(bin, "-h").CombinedOutput() // -h exits with status 0 or 2
		flags[name] = flagsOfUsage(string(usage))
	}

	var buf bytes.Buffer
	_, _ = loader.ParseArgs([]string{"-h"}, &buf)
	flags["model-loader"] = flagsOfUsage(buf.String())
	buf.Reset()
	warmup.Main([]string{"-h"}, &buf)
	flags["warmup"] = flagsOfUsage(buf.String())
	buf.Reset()
	router.Main([]string{"-h"}, &buf)
	flags["router"] = flagsOfUsage(buf.String())

	var aii []string
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, fs := range []*pflag.FlagSet{c.Flags(), c.PersistentFlags()} {
			fs.VisitAll(func(f *pflag.Flag) { aii = append(aii, f.Name) })
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(kubectlaii.NewCommand(genericiooptions.NewTestIOStreamsDiscard()))
	flags["kubectl-aii"] = aii

	for name, f := range flags {
		if len(f) < 2 {
			t.Fatalf("read only %v as the flags of %s: the way this test reads them broke", f, name)
		}
	}
	return flags
}

// hasFlag reports whether name (or, for a name ending in *, a flag of that
// prefix) is among flags.
func hasFlag(flags []string, name string) bool {
	if prefix, ok := strings.CutSuffix(name, "*"); ok {
		return slices.ContainsFunc(flags, func(f string) bool { return strings.HasPrefix(f, prefix) })
	}
	return slices.Contains(flags, name)
}

// TestDocsNameRealFlags: every --flag in the docs' code is a flag of the
// binary the line runs, or (written alone) of one of the binaries, or a
// known flag of another program.
func TestDocsNameRealFlags(t *testing.T) {
	flags := ourFlags(t)
	var all []string
	for _, f := range flags {
		all = append(all, f...)
	}
	for path, text := range docs(t) {
		var code []string // fenced lines and code spans
		for _, block := range fence.FindAllString(text, -1) {
			// A command continued on the next line is one line.
			code = append(code, strings.Split(strings.ReplaceAll(block, "\\\n", " "), "\n")...)
		}
		for _, m := range codeSpan.FindAllStringSubmatch(fence.ReplaceAllString(text, ""), -1) {
			code = append(code, m[1])
		}
		for _, line := range code {
			line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "$ "))
			checked := false
			for _, bin := range []string{"warmup", "model-loader", "manager", "kubectl-aii", "router", "ollama-start"} {
				m := invocations[bin].FindStringSubmatch(line)
				if m == nil {
					continue
				}
				checked = true
				for _, f := range flagRef.FindAllStringSubmatch(m[1], -1) {
					if !hasFlag(flags[bin], f[1]) {
						t.Errorf("%s: --%s is not a flag of %s (in %q)", path, f[1], bin, line)
					}
				}
				break
			}
			if checked || !strings.HasPrefix(line, "--") {
				continue // a command of another program
			}
			checkAlone(t, path, line, all)
		}
		// Prose names flags alone too.
		prose := codeSpan.ReplaceAllString(fence.ReplaceAllString(text, ""), "")
		checkAlone(t, path, prose, all)
	}
}

// checkAlone checks the flags of text, which names them without running a
// binary: each must be one of ours or a known flag of another program.
func checkAlone(t *testing.T, path, text string, ours []string) {
	t.Helper()
	for _, f := range flagRef.FindAllStringSubmatch(text, -1) {
		if _, ok := externalFlags[f[1]]; !ok && !hasFlag(ours, f[1]) {
			t.Errorf("%s: --%s is no flag of manager, model-loader, router, ollama-start or kubectl aii (in %q); if it is another program's, add it to externalFlags", path, f[1], strings.TrimSpace(f[0]))
		}
	}
}

// knownWords are the words the code and manifests hold: every reason the
// operator reports, the string constants and literals of the Go code (reasons,
// condition types, phases, enum values, event reasons), the Go test names, and
// the words of config/ (alert names, kinds).
func knownWords(t *testing.T) map[string]bool {
	t.Helper()
	known := map[string]bool{}
	for _, e := range reasons.All {
		known[e.Reason] = true
	}
	for _, w := range externalWords {
		known[w] = true
	}
	fset := token.NewFileSet()
	for _, dir := range []string{"api", "cmd", "internal", "test", "hack", "charts", "integrations"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.BasicLit:
					if n.Kind == token.STRING && !strings.HasSuffix(path, "_test.go") {
						if s, err := strconv.Unquote(n.Value); err == nil {
							for _, w := range regexp.MustCompile(`[A-Za-z0-9]+`).FindAllString(s, -1) {
								known[w] = true
							}
						}
					}
				case *ast.FuncDecl:
					known[n.Name.Name] = true // test and benchmark names
				case *ast.TypeSpec:
					known[n.Name.Name] = true
				case *ast.Field:
					for _, name := range n.Names {
						known[name.Name] = true // options the docs name, e.g. BinDir
					}
				case *ast.ValueSpec:
					for _, name := range n.Names {
						known[name.Name] = true
					}
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// The manifests and scripts the project ships: config/, and integrations/
	// (Argo CD, Flux, Karmada and OCM customizations).
	for _, dir := range []string{"config", "integrations"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !(strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".lua")) {
				return err
			}
			data, err := os.ReadFile(path)
			for _, w := range regexp.MustCompile(`[A-Za-z0-9]+`).FindAllString(string(data), -1) {
				known[w] = true
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return known
}

// TestDocsNameRealWords: every PascalCase word the docs write as code (a
// reason such as `SecretNotFound`, a condition, a phase, a test name) exists in
// the code or the manifests.
func TestDocsNameRealWords(t *testing.T) {
	known := knownWords(t)
	for path, text := range docs(t) {
		for _, m := range codeSpan.FindAllStringSubmatch(fence.ReplaceAllString(text, ""), -1) {
			w := m[1]
			// A trailing N stands for a number, as in LoaderExitN (N the exit code).
			if prefix, ok := strings.CutSuffix(w, "N"); ok && known[prefix] {
				continue
			}
			if pascal.MatchString(w) && !known[w] {
				t.Errorf("%s: `%s` is no reason, condition, phase or other name the code, config/ or integrations/ holds", path, w)
			}
		}
	}
}

// TestDocsIndexListsEveryDoc: docs/README.md links every doc of docs/, and the
// README links docs/README.md.
func TestDocsIndexListsEveryDoc(t *testing.T) {
	all := docs(t)
	index, ok := all[filepath.Join("docs", "README.md")]
	if !ok {
		t.Fatal("no docs/README.md")
	}
	for path := range all {
		name := filepath.Base(path)
		if filepath.Dir(path) != "docs" || name == "README.md" {
			continue
		}
		if !strings.Contains(index, "]("+name+")") {
			t.Errorf("docs/README.md does not list %s: add a line for it", name)
		}
	}
	if !strings.Contains(all["README.md"], "(docs/README.md)") {
		t.Error("README.md does not link docs/README.md")
	}
}
