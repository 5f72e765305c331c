package main

// The engine image's /bin/bash (and /bash, for PATH) is fake-vllm, which
// then runs as a stand-in for bash, not bash: it runs the two command lines
// the operator gives a multi-node replica's engine (internal/engine/vllm.go,
// LeaderCommand and WorkerCommand), and nothing else:
//
//	/bin/bash -c 'bash …/multi-node-serving.sh leader --ray_cluster_size="$LWS_GROUP_SIZE" && exec python3 -m vllm.entrypoints.openai.api_server "$@"' vllm-leader ARGS...
//	/bin/bash -c 'exec bash …/multi-node-serving.sh worker --ray_address="$LWS_LEADER_ADDRESS"'
//
// -c takes simple commands joined by &&, made of words with single and
// double quotes, backslash escapes and $NAME, ${NAME}, $0-$9 and "$@"
// expansions, and exec; the command names are looked up in PATH and run as
// bash runs them (a child process, or in place of the shell for exec), so
// that the image's other stand-ins (python3, ray) play their parts. Any other
// shell syntax is refused with exit code 2 and says so, rather than run
// otherwise than bash would. `bash FILE ARGS...` runs only vLLM's
// multi-node-serving.sh, by its file name (raycluster.go), whose file the
// image does not hold.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// multiNodeScript is the base name of vLLM's multi-node helper, which the
// operator runs from /vllm-workspace/examples/online_serving in the image.
const multiNodeScript = "multi-node-serving.sh"

// errUnsupported is shell syntax the stand-in does not run.
var errUnsupported = errors.New("fake-vllm's bash stand-in runs only the operator's vLLM multi-node command lines")

// bashMain is `bash ARGS...`; it returns the exit code.
func bashMain(args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) >= 2 && args[0] == "-c":
		name, params := "bash", []string(nil)
		if len(args) > 2 {
			name, params = args[2], args[3:]
		}
		commands, err := parseScript(args[1], name, params, os.Getenv)
		if err != nil {
			fmt.Fprintf(stderr, "bash: %v\n", err)
			return 2
		}
		return runCommands(commands, stderr)
	case len(args) >= 1 && filepath.Base(args[0]) == multiNodeScript:
		return multiNodeServing(args[1:], newScriptEnv(stdout))
	default:
		fmt.Fprintf(stderr, "bash: %v (bash -c SCRIPT, or bash %s), not bash %s\n", errUnsupported, multiNodeScript, strings.Join(args, " "))
		return 2
	}
}

// runCommands runs commands as `a && b && ...` does, each a list of words,
// and returns the exit code of the last that ran. A command whose first word
// is exec replaces this process.
func runCommands(commands [][]string, stderr io.Writer) int {
	for _, argv := range commands {
		replace := argv[0] == "exec"
		if replace {
			argv = argv[1:]
			if len(argv) == 0 {
				continue
			}
		}
		path, err := exec.LookPath(argv[0])
		if err != nil {
			fmt.Fprintf(stderr, "bash: line 1: %s: command not found\n", argv[0])
			return 127
		}
		if replace {
			err = syscall.Exec(path, argv, os.Environ())
			fmt.Fprintf(stderr, "bash: line 1: %s: %v\n", argv[0], err)
			return 126
		}
		if code := runChild(path, argv); code != 0 {
			return code
		}
	}
	return 0
}

// runChild runs path with argv (argv[0] as given, as a shell passes it) and
// this process's standard streams and environment, and returns its exit
// code: 128+N for a child killed by signal N, as bash reports it.
func runChild(path string, argv []string) int {
	cmd := &exec.Cmd{Path: path, Args: argv, Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		if status, ok := exit.Sys().(syscall.WaitStatus); ok && status.Signaled() {
			return 128 + int(status.Signal())
		}
		return exit.ExitCode()
	default:
		fmt.Fprintf(os.Stderr, "bash: line 1: %s: %v\n", argv[0], err)
		return 126
	}
}

// parseScript reads a -c script into its commands (words, expanded), for
// bash -c SCRIPT NAME PARAMS...: NAME is $0 and PARAMS are $1... and "$@";
// getenv gives the variables.
func parseScript(script, name string, params []string, getenv func(string) string) ([][]string, error) {
	p := &scriptParser{src: []rune(script), name: name, params: params, getenv: getenv}
	return p.parse()
}

type scriptParser struct {
	src    []rune
	pos    int
	name   string
	params []string
	getenv func(string) string

	commands [][]string
	words    []string
	word     strings.Builder
	inWord   bool // the word has begun (an empty "" is a word)
}

func (p *scriptParser) parse() ([][]string, error) {
	for p.pos < len(p.src) {
		r := p.src[p.pos]
		p.pos++
		switch {
		case r == ' ' || r == '\t' || r == '\n':
			p.endWord()
		case r == '&':
			if p.pos >= len(p.src) || p.src[p.pos] != '&' {
				return nil, p.unsupported("&")
			}
			p.pos++
			if err := p.endCommand(); err != nil {
				return nil, err
			}
		case r == '\'':
			end := indexRune(p.src[p.pos:], '\'')
			if end < 0 {
				return nil, errors.New("unexpected end of script while looking for matching `''")
			}
			p.word.WriteString(string(p.src[p.pos : p.pos+end]))
			p.inWord = true
			p.pos += end + 1
		case r == '"':
			if err := p.doubleQuoted(); err != nil {
				return nil, err
			}
		case r == '\\':
			if p.pos < len(p.src) {
				if p.src[p.pos] != '\n' { // a line continuation joins lines
					p.word.WriteRune(p.src[p.pos])
					p.inWord = true
				}
				p.pos++
			}
		case r == '$':
			if err := p.expand(false); err != nil {
				return nil, err
			}
		case r == '#' && !p.inWord:
			return nil, p.unsupported("#")
		case strings.ContainsRune(";|<>(){}`*?[~", r):
			return nil, p.unsupported(string(r))
		default:
			p.word.WriteRune(r)
			p.inWord = true
		}
	}
	p.endWord()
	if len(p.words) > 0 || len(p.commands) > 0 {
		if err := p.endCommand(); err != nil {
			return nil, err
		}
	}
	return p.commands, nil
}

func (p *scriptParser) unsupported(what string) error {
	return fmt.Errorf("%w: %q at offset %d of the script", errUnsupported, what, p.pos-1)
}

func (p *scriptParser) endWord() {
	if p.inWord {
		p.words = append(p.words, p.word.String())
	}
	p.word.Reset()
	p.inWord = false
}

func (p *scriptParser) endCommand() error {
	p.endWord()
	if len(p.words) == 0 {
		return errors.New("syntax error near unexpected token `&&'")
	}
	if first := p.words[0]; isAssignment(first) {
		return fmt.Errorf("%w: the variable assignment %q", errUnsupported, first)
	}
	p.commands = append(p.commands, p.words)
	p.words = nil
	return nil
}

// doubleQuoted reads a "..." word part, after its opening quote.
func (p *scriptParser) doubleQuoted() error {
	p.inWord = true
	for p.pos < len(p.src) {
		r := p.src[p.pos]
		p.pos++
		switch r {
		case '"':
			return nil
		case '\\':
			if p.pos < len(p.src) && strings.ContainsRune("$`\"\\\n", p.src[p.pos]) {
				if p.src[p.pos] != '\n' {
					p.word.WriteRune(p.src[p.pos])
				}
				p.pos++
			} else {
				p.word.WriteRune('\\')
			}
		case '$':
			if p.pos < len(p.src) && p.src[p.pos] == '@' {
				// Only "$@" as a whole word: each parameter a word of its
				// own, no word without any.
				if p.word.Len() > 0 || p.pos+1 >= len(p.src) || p.src[p.pos+1] != '"' ||
					(p.pos+2 < len(p.src) && !isBlank(p.src[p.pos+2])) {
					return p.unsupported("$@ within a word")
				}
				p.pos += 2
				p.words = append(p.words, p.params...)
				p.inWord = false
				return nil
			}
			if err := p.expand(true); err != nil {
				return err
			}
		case '`':
			return p.unsupported("`")
		default:
			p.word.WriteRune(r)
		}
	}
	return errors.New("unexpected end of script while looking for matching `\"'")
}

// expand reads an expansion after its $: $NAME, ${NAME}, $0-$9 or $@ ("$@"
// only as a whole word). Unquoted, the value is split into words at blanks.
func (p *scriptParser) expand(quoted bool) error {
	if p.pos >= len(p.src) {
		p.word.WriteRune('$')
		p.inWord = true
		return nil
	}
	r := p.src[p.pos]
	var value string
	switch {
	case r == '@':
		// Unquoted $@ splits each parameter at blanks; only its quoted form
		// is taken (doubleQuoted).
		return p.unsupported("$@ unquoted")
	case r >= '0' && r <= '9':
		p.pos++
		if n := int(r - '0'); n == 0 {
			value = p.name
		} else if n <= len(p.params) {
			value = p.params[n-1]
		}
	case r == '{':
		end := indexRune(p.src[p.pos:], '}')
		if end < 0 {
			return errors.New("bad substitution: no closing `}'")
		}
		name := string(p.src[p.pos+1 : p.pos+end])
		if !isName(name) {
			return p.unsupported("${" + name + "}")
		}
		p.pos += end + 1
		value = p.getenv(name)
	case r == '_' || isLetter(r):
		start := p.pos
		for p.pos < len(p.src) && (p.src[p.pos] == '_' || isLetter(p.src[p.pos]) || (p.src[p.pos] >= '0' && p.src[p.pos] <= '9')) {
			p.pos++
		}
		value = p.getenv(string(p.src[start:p.pos]))
	case r == '(' || r == '#' || r == '*' || r == '?' || r == '$' || r == '!' || r == '-':
		return p.unsupported("$" + string(r))
	default:
		p.word.WriteRune('$') // a lone $ stays
		p.inWord = true
		return nil
	}
	if quoted {
		p.word.WriteString(value)
		return nil
	}
	// Unquoted: split at blanks (the default IFS); no pathname expansion.
	fields := strings.FieldsFunc(value, func(r rune) bool { return r == ' ' || r == '\t' || r == '\n' })
	if len(fields) == 0 {
		return nil
	}
	if isBlank(rune(value[0])) {
		p.endWord()
	}
	for i, f := range fields {
		if i > 0 {
			p.endWord()
		}
		p.word.WriteString(f)
		p.inWord = true
	}
	if isBlank(rune(value[len(value)-1])) {
		p.endWord()
	}
	return nil
}

func indexRune(rs []rune, r rune) int {
	for i, x := range rs {
		if x == r {
			return i
		}
	}
	return -1
}

func isBlank(r rune) bool  { return r == ' ' || r == '\t' || r == '\n' }
func isLetter(r rune) bool { return (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') }

func isAssignment(w string) bool {
	name, _, found := strings.Cut(w, "=")
	return found && isName(name)
}

func isName(s string) bool {
	if s == "" || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for _, r := range s {
		if r != '_' && !isLetter(r) && (r < '0' || r > '9') {
			return false
		}
	}
	return true
}
