package router

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// MaxMessages bounds the chat messages of one request the router reads: a
// body of 8 MiB holds millions of empty ones, each costing the router and the
// engine work for nothing.
const MaxMessages = 16384

// request is what the router reads of an OpenAI request body: what it routes
// by, and no more. Reading it costs no allocation per element of the body:
// the prompt is kept as pieces of the body itself (an escaped string is
// unescaped into a copy of its own size).
type request struct {
	Model  string
	Stream bool
	// modelStart and modelEnd are where the "model" value lies in the body,
	// for withModel; both 0 when there is none.
	modelStart, modelEnd int
	// prompt is the text whose prefix the engine caches, in pieces: the
	// prompt of a completion, or the chat messages in order (role and
	// content, each followed by a 0 byte), as the engine's chat template lays
	// them one after the other. A turn of a conversation resends the turns
	// before it, so its text starts with theirs. A content that is not a
	// string (parts, token ids) is its JSON, as stable.
	prompt [][]byte
}

// errTooManyMessages is the one reading failure the client is told of: the
// rest (a body that is not JSON, a field of the wrong type) is the engine's to
// answer.
var errTooManyMessages = fmt.Errorf("the request has more than %d messages", MaxMessages)

// errDuplicateField refuses a body that names a routed field twice: JSON
// parsers disagree on which one counts, and the router must read the body as
// the engine does.
var errDuplicateField = errors.New("the request body gives a field twice")

// parseRequest reads the fields the router routes by. A body that is not a
// JSON object routes as one with no prompt (the engine answers what is
// wrong); err is set only for a body the router refuses (400).
func parseRequest(body []byte) (request, error) {
	s := jsonScanner{b: body}
	var r request
	var messages [][]byte
	seen := map[string]bool{}
	err := s.object(func(key []byte, keyEscaped bool) error {
		name := string(key)
		if keyEscaped {
			name = s.unescape(key)
		}
		switch name {
		case "model", "stream", "prompt", "messages":
			if seen[name] {
				return fmt.Errorf("%w: %q", errDuplicateField, name)
			}
			seen[name] = true
		default:
			return s.skip()
		}
		s.space()
		start := s.i
		switch name {
		case "model":
			v, escaped, err := s.str()
			if err != nil {
				return s.skipFrom(start)
			}
			r.Model, r.modelStart, r.modelEnd = string(v), start, s.i
			if escaped {
				r.Model = s.unescape(v)
			}
		case "stream":
			if err := s.skip(); err != nil {
				return err
			}
			r.Stream = string(body[start:s.i]) == "true"
		case "prompt":
			if err := s.skip(); err != nil {
				return err
			}
			r.prompt = [][]byte{s.text(body[start:s.i])}
		case "messages":
			var err error
			if messages, err = s.messages(); err != nil {
				return err
			}
		}
		return nil
	})
	switch {
	case errors.Is(err, errTooManyMessages) || errors.Is(err, errDuplicateField):
		return request{}, err
	case err != nil || s.peek() != 0:
		return request{}, nil // not JSON, or more than one value
	}
	if len(messages) > 0 {
		r.prompt = messages
	}
	return r, nil
}

// withModel is body with its "model" value set to model; body itself when it
// names none. The rest of the body is left byte for byte as it was.
func withModel(body []byte, r request, model string) []byte {
	if r.modelEnd == 0 {
		return body
	}
	quoted, _ := json.Marshal(model)
	out := make([]byte, 0, len(body)-(r.modelEnd-r.modelStart)+len(quoted))
	out = append(out, body[:r.modelStart]...)
	out = append(out, quoted...)
	return append(out, body[r.modelEnd:]...)
}

// jsonScanner walks a JSON text in place. It checks what it walks enough to
// find its way (strings, nesting) and leaves the rest of JSON's rules to the
// engine, which parses the body again.
type jsonScanner struct {
	b []byte
	i int
}

var errNotJSON = errors.New("not JSON")

func (s *jsonScanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *jsonScanner) peek() byte {
	s.space()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// str reads a string: its raw content between the quotes, and whether it
// holds escapes.
func (s *jsonScanner) str() (raw []byte, escaped bool, err error) {
	if s.peek() != '"' {
		return nil, false, errNotJSON
	}
	start := s.i + 1
	for i := start; i < len(s.b); i++ {
		switch c := s.b[i]; {
		case c == '\\':
			escaped = true
			i++
		case c == '"':
			s.i = i + 1
			return s.b[start:i], escaped, nil
		case c < 0x20:
			return nil, false, errNotJSON
		}
	}
	return nil, false, errNotJSON
}

// unescape is a string's value; "" when its escapes are not JSON's.
func (s *jsonScanner) unescape(raw []byte) string {
	quoted := make([]byte, 0, len(raw)+2)
	quoted = append(append(append(quoted, '"'), raw...), '"')
	var v string
	if json.Unmarshal(quoted, &v) != nil {
		return ""
	}
	return v
}

// text is what a prompt or content value adds to the prompt: a string's
// value, or the JSON of anything else.
func (s *jsonScanner) text(value []byte) []byte {
	if len(value) < 2 || value[0] != '"' {
		return value
	}
	raw := value[1 : len(value)-1]
	for _, c := range raw {
		if c == '\\' {
			return []byte(s.unescape(raw))
		}
	}
	return raw
}

// skip passes over one value of any kind, without recursion: the depth of a
// JSON bomb costs nothing.
func (s *jsonScanner) skip() error {
	depth := 0
	for {
		switch c := s.peek(); c {
		case 0:
			return errNotJSON
		case '"':
			if _, _, err := s.str(); err != nil {
				return err
			}
		case '{', '[':
			depth++
			s.i++
		case '}', ']':
			if depth == 0 {
				return errNotJSON
			}
			depth--
			s.i++
		case ',', ':':
			if depth == 0 {
				return errNotJSON
			}
			s.i++
		default:
			// A number, true, false or null: up to the next delimiter.
			start := s.i
			for s.i < len(s.b) && !isDelimiter(s.b[s.i]) {
				s.i++
			}
			if s.i == start {
				return errNotJSON
			}
		}
		if depth == 0 {
			return nil
		}
	}
}

// skipFrom skips the value that starts at start.
func (s *jsonScanner) skipFrom(start int) error {
	s.i = start
	return s.skip()
}

func isDelimiter(c byte) bool {
	switch c {
	case ',', ':', '{', '}', '[', ']', '"', ' ', '\t', '\n', '\r':
		return true
	}
	return false
}

// object walks an object, calling member with each key while the scanner
// stands before its value; member must read or skip the value.
func (s *jsonScanner) object(member func(key []byte, escaped bool) error) error {
	if s.peek() != '{' {
		return errNotJSON
	}
	s.i++
	if s.peek() == '}' {
		s.i++
		return nil
	}
	for {
		key, escaped, err := s.str()
		if err != nil {
			return err
		}
		if s.peek() != ':' {
			return errNotJSON
		}
		s.i++
		if err := member(key, escaped); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return nil
		default:
			return errNotJSON
		}
	}
}

// messages reads the chat messages into prompt pieces, at most MaxMessages.
func (s *jsonScanner) messages() ([][]byte, error) {
	if s.peek() != '[' {
		return nil, s.skip()
	}
	s.i++
	if s.peek() == ']' {
		s.i++
		return nil, nil
	}
	// Counted first, so that the pieces take one allocation of their size.
	n, err := s.count()
	if err != nil {
		return nil, err
	}
	pieces := make([][]byte, 0, 4*n)
	// One closure for every message: the elements cost no allocation.
	var role, content []byte
	member := func(key []byte, escaped bool) error {
		name := string(key)
		if escaped {
			name = s.unescape(key)
		}
		s.space()
		start := s.i
		if err := s.skip(); err != nil {
			return err
		}
		switch name {
		case "role":
			role = s.text(s.b[start:s.i])
		case "content":
			content = s.text(s.b[start:s.i])
		}
		return nil
	}
	for n := 0; ; n++ {
		if n == MaxMessages {
			return nil, errTooManyMessages
		}
		role, content = nil, nil
		if s.peek() != '{' {
			if err := s.skip(); err != nil {
				return nil, err
			}
		} else if err := s.object(member); err != nil {
			return nil, err
		}
		pieces = append(pieces, role, zeroByte, content, zeroByte)
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return pieces, nil
		default:
			return nil, errNotJSON
		}
	}
}

var zeroByte = []byte{0}

// count is how many elements the array the scanner stands in has from here,
// at most MaxMessages+1; the scanner does not move.
func (s *jsonScanner) count() (int, error) {
	start := s.i
	defer func() { s.i = start }()
	for n := 1; n <= MaxMessages; n++ {
		if err := s.skip(); err != nil {
			return 0, err
		}
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			return n, nil
		default:
			return 0, errNotJSON
		}
	}
	return 0, errTooManyMessages
}

// promptLen is the prompt's length in bytes.
func (r request) promptLen() int {
	n := 0
	for _, p := range r.prompt {
		n += len(p)
	}
	return n
}

// blockHashes are the chained hashes of the text's whole blocks: the i-th
// hashes block i and the hash before it, so that two texts share the i-th hash
// only when they share their first i+1 blocks, as an engine's prefix cache
// matches blocks. A partial last block is left out: engines cache whole blocks.
// xxhash has no per-process seed, so router replicas agree on every hash.
func blockHashes(text []byte, blockSize int) []uint64 {
	return blockHashesOf([][]byte{text}, blockSize)
}

// blockHashesOf is blockHashes of the pieces laid end to end, without
// laying them out: a block that spans pieces is copied, one block at most.
func blockHashesOf(pieces [][]byte, blockSize int) []uint64 {
	if blockSize <= 0 {
		return nil
	}
	total := 0
	for _, p := range pieces {
		total += len(p)
	}
	hashes := make([]uint64, 0, total/blockSize)
	var prev [8]byte
	d := xxhash.New()
	partial := make([]byte, 0, blockSize)
	emit := func(block []byte) {
		d.Reset()
		_, _ = d.Write(prev[:])
		_, _ = d.Write(block)
		h := d.Sum64()
		hashes = append(hashes, h)
		for j := range prev {
			prev[j] = byte(h >> (8 * j))
		}
	}
	for _, p := range pieces {
		for len(p) > 0 {
			if len(partial) == 0 && len(p) >= blockSize {
				emit(p[:blockSize])
				p = p[blockSize:]
				continue
			}
			n := min(blockSize-len(partial), len(p))
			partial, p = append(partial, p[:n]...), p[n:]
			if len(partial) == blockSize {
				emit(partial)
				partial = partial[:0]
			}
		}
	}
	return hashes
}
