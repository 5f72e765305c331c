package routerfaults

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Outcome is how one request ended, as its client saw it.
type Outcome int

const (
	// OK: answered in full (a stream: content, then its end).
	OK Outcome = iota
	// Refused: HTTP 429 (shed or over a bound; the client may retry).
	Refused
	// Failed: an answer that is an error (a status other than 2xx and 429,
	// an error event in a stream, a stream that broke off after its start).
	Failed
	// Lost: no answer within the client's timeout, or the connection failed
	// before any answer.
	Lost
	// Held: still waiting when the case ended it (a case that holds
	// requests on purpose: a replica that never answers, a client that
	// never reads).
	Held
)

// Result is one request's end.
type Result struct {
	Outcome Outcome
	// Status is the HTTP status, 0 without one.
	Status int
	// TTFT is the time to the first content of a stream, or to the headers
	// of an answer that is not one; set for OK only.
	TTFT time.Duration
	// Why is what went wrong, for the report.
	Why string
}

// Tally counts a case's requests.
type Tally struct {
	mu                                    sync.Mutex
	Sent, OK, Refused, Failed, Lost, Held int
	TTFTs                                 []time.Duration
	// Statuses counts the HTTP statuses seen.
	Statuses map[int]int
	// FirstFailure is the first Failed or Lost request's reason.
	FirstFailure string
}

// Add counts one result.
func (t *Tally) Add(r Result) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.Sent++
	if t.Statuses == nil {
		t.Statuses = map[int]int{}
	}
	if r.Status != 0 {
		t.Statuses[r.Status]++
	}
	switch r.Outcome {
	case OK:
		t.OK++
		t.TTFTs = append(t.TTFTs, r.TTFT)
	case Refused:
		t.Refused++
	case Failed:
		t.Failed++
	case Lost:
		t.Lost++
	case Held:
		t.Held++
	}
	if (r.Outcome == Failed || r.Outcome == Lost) && t.FirstFailure == "" {
		t.FirstFailure = r.Why
	}
}

// Share is part of the requests sent, 0 when none was.
func (t *Tally) Share(n int) float64 {
	if t.Sent == 0 {
		return 0
	}
	return float64(n) / float64(t.Sent)
}

// TTFT is the q-quantile of the answered requests' time to first token,
// with each request that was not answered in time counted as penalty (a
// request lost to a queue waited at least its timeout); 0 without any.
func (t *Tally) TTFT(q float64, penalty time.Duration) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	all := slices.Clone(t.TTFTs)
	for range t.Lost + t.Held {
		all = append(all, penalty)
	}
	if len(all) == 0 {
		return 0
	}
	slices.Sort(all)
	return all[min(len(all)-1, int(q*float64(len(all))))]
}

// String is the counts on one line.
func (t *Tally) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := fmt.Sprintf("sent=%d ok=%d failed=%d 429=%d lost=%d", t.Sent, t.OK, t.Failed, t.Refused, t.Lost)
	if t.Held > 0 {
		s += fmt.Sprintf(" held=%d", t.Held)
	}
	var codes []int
	for c := range t.Statuses {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	var parts []string
	for _, c := range codes {
		parts = append(parts, fmt.Sprintf("%d:%d", c, t.Statuses[c]))
	}
	if len(parts) > 0 {
		s += " statuses=" + strings.Join(parts, ",")
	}
	return s
}

// ClientFrom is an HTTP client whose connections come from the loopback
// address ip (127.0.0.2, ...): the router learns a client's namespace from
// its address (world.File.Clients).
func ClientFrom(ip string) *http.Client {
	dialer := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return &http.Client{Transport: &http.Transport{
		DialContext:         dialer.DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     30 * time.Second,
	}}
}

// Request is one request to the router.
type Request struct {
	// URL is the router's base URL; Host the Host header (the model's
	// Service name).
	URL, Host string
	// Path default /v1/chat/completions.
	Path   string
	Header http.Header
	Body   []byte
	// Timeout bounds the whole request; 0: none but the context's.
	Timeout time.Duration
	// HeldBy, when it ends, marks a request still waiting as Held rather
	// than Lost.
	HeldBy context.Context
}

// Send sends the request and reads its answer to the end: a stream chunk by
// chunk (TTFT at the first content), anything else whole.
func Send(ctx context.Context, c *http.Client, r Request) Result {
	if r.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.Timeout)
		defer cancel()
	}
	if r.HeldBy != nil {
		var stop func() bool
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		stop = context.AfterFunc(r.HeldBy, cancel)
		defer stop()
	}
	path := r.Path
	if path == "" {
		path = "/v1/chat/completions"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.URL+path, bytes.NewReader(r.Body))
	if err != nil {
		return Result{Outcome: Failed, Why: err.Error()}
	}
	for k, v := range r.Header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	req.Host = r.Host
	begin := time.Now()
	lost := func(err error) Result {
		if r.HeldBy != nil && r.HeldBy.Err() != nil {
			return Result{Outcome: Held}
		}
		return Result{Outcome: Lost, Why: err.Error()}
	}
	resp, err := c.Do(req)
	if err != nil {
		return lost(err)
	}
	defer func() { _ = resp.Body.Close() }()
	res := Result{Status: resp.StatusCode}
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		res.Outcome = Refused
		return res
	case resp.StatusCode/100 != 2:
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		res.Outcome, res.Why = Failed, fmt.Sprintf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
		return res
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		res.TTFT = time.Since(begin)
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			res.Outcome, res.Why = Failed, "the answer broke off: "+err.Error()
			return res
		}
		res.Outcome = OK
		return res
	}
	scanner := bufio.NewScanner(resp.Body)
	scanner.Buffer(make([]byte, 64<<10), 1<<20)
	done := false
	for scanner.Scan() {
		data, ok := bytes.CutPrefix(scanner.Bytes(), []byte("data: "))
		if !ok {
			continue
		}
		if bytes.Equal(data, []byte("[DONE]")) {
			done = true
			break
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Error *struct {
				Message string `json:"message"`
				Code    any    `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(data, &chunk); err != nil {
			res.Outcome, res.Why = Failed, fmt.Sprintf("a chunk that is not JSON: %.200s", data)
			return res
		}
		if chunk.Error != nil {
			res.Outcome, res.Why = Failed, fmt.Sprintf("error event (%v): %s", chunk.Error.Code, chunk.Error.Message)
			if fmt.Sprint(chunk.Error.Code) == "429" {
				res.Outcome = Refused
			}
			return res
		}
		for _, c := range chunk.Choices {
			if c.Delta.Content != "" && res.TTFT == 0 {
				res.TTFT = time.Since(begin)
			}
		}
	}
	switch err := scanner.Err(); {
	case err != nil && res.TTFT == 0:
		// Headers came (a waiting stream's) but no content within the timeout.
		return lost(err)
	case err != nil:
		res.Outcome, res.Why = Failed, "the stream broke off: "+err.Error()
	case !done && res.TTFT == 0:
		res.Outcome, res.Why = Failed, "the stream ended with no content"
	case !done:
		res.Outcome, res.Why = Failed, "the stream ended without [DONE]"
	default:
		res.Outcome = OK
	}
	return res
}

// ChatBody is a streaming chat completion of model with the messages.
func ChatBody(model string, maxTokens int, messages ...string) []byte {
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var ms []message
	for i, m := range messages {
		role := "user"
		if i == 0 && len(messages) > 1 {
			role = "system"
		}
		ms = append(ms, message{Role: role, Content: m})
	}
	body, _ := json.Marshal(map[string]any{
		"model": model, "messages": ms, "max_tokens": maxTokens, "stream": true, "ignore_eos": true,
	})
	return body
}

// OpenLoop calls send(i) for i in [0, n) at rate per second, each in its
// own goroutine, without waiting for earlier calls (an open loop: a
// client's arrivals do not slow down when the server does), and returns
// once every call has returned or ctx has ended and the calls with it.
func OpenLoop(ctx context.Context, rate float64, n int, send func(i int)) {
	var wg sync.WaitGroup
	begin := time.Now()
	for i := range n {
		at := begin.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(at)):
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() { send(i) })
	}
	wg.Wait()
}

// ClosedLoop runs workers that each send one request after the other until
// d has passed; the requests done per second.
func ClosedLoop(ctx context.Context, workers int, d time.Duration, send func() bool) float64 {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var mu sync.Mutex
	done := 0
	var wg sync.WaitGroup
	begin := time.Now()
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				ok := send()
				if ctx.Err() != nil {
					return // cut by the end of the window: not counted
				}
				if ok {
					mu.Lock()
					done++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return float64(done) / time.Since(begin).Seconds()
}

// RawClient is a client that speaks HTTP/1.1 by hand on its own TCP
// connection, from a loopback address: one that sends a body slowly, or
// sends a request and never reads the answer.
type RawClient struct {
	Conn net.Conn
}

// DialRaw connects to addr from the loopback address from.
func DialRaw(from, addr string) (*RawClient, error) {
	d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &RawClient{Conn: c}, nil
}

// WriteHead writes a POST's request line and headers, declaring
// contentLength bytes of body.
func (c *RawClient) WriteHead(host, path string, contentLength int64) error {
	_, err := fmt.Fprintf(c.Conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, host, contentLength)
	return err
}
