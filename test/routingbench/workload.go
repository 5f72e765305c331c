package routingbench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// WorkloadOptions shape a chat workload. Zero values take the defaults.
type WorkloadOptions struct {
	// Tenants each have their own long system prompt. Default 6.
	Tenants int
	// SystemPromptWords is the length of a tenant's system prompt. Default 1200.
	SystemPromptWords int
	// Conversations per tenant. Default 6.
	Conversations int
	// Turns per conversation; each turn resends the ones before. Default 3.
	Turns int
	// TurnWords is the length of a user's message. Default 120.
	TurnWords int
	// MaxTokens is each answer's length. Default 24.
	MaxTokens int
	// Seed makes the same workload each time.
	Seed uint64
}

func (o WorkloadOptions) withDefaults() WorkloadOptions {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.Tenants, 6)
	def(&o.SystemPromptWords, 1200)
	def(&o.Conversations, 6)
	def(&o.Turns, 3)
	def(&o.TurnWords, 120)
	def(&o.MaxTokens, 24)
	return o
}

// Conversation is one user's chat with a tenant's assistant.
type Conversation struct {
	Tenant int
	System string
	// Turns are the user's messages, sent one after the other, each with the
	// history (and the answers) before it.
	Turns     []string
	MaxTokens int
}

// Generate makes the workload: the conversations of every tenant,
// interleaved, in the order they start.
func Generate(o WorkloadOptions) []Conversation {
	o = o.withDefaults()
	r := rand.New(rand.NewPCG(o.Seed, 0x9e3779b97f4a7c15))
	words := func(n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(vocabulary[r.IntN(len(vocabulary))])
		}
		return b.String()
	}
	systems := make([]string, o.Tenants)
	for i := range systems {
		systems[i] = fmt.Sprintf("You are the assistant of tenant %d. %s", i, words(o.SystemPromptWords))
	}
	var out []Conversation
	for c := range o.Conversations {
		for t := range o.Tenants {
			conv := Conversation{Tenant: t, System: systems[t], MaxTokens: o.MaxTokens}
			for turn := range o.Turns {
				conv.Turns = append(conv.Turns, fmt.Sprintf("Conversation %d, question %d: %s", c, turn, words(o.TurnWords)))
			}
			out = append(out, conv)
		}
	}
	return out
}

var vocabulary = strings.Fields(`model replica cache prefix token request latency batch queue server cluster
node pod service route policy tenant prompt answer question system history context window memory block
hash ring load bound spill session engine metric scrape weight canary stable rollout gateway network
storage volume image registry download verify resume progress status condition reason message event`)

// RunOptions say where and how fast the workload is sent.
type RunOptions struct {
	// Targets are base URLs (http://host:port); each request goes to the next,
	// round robin, as a Service without routing spreads them.
	Targets []string
	// Rate is how many conversations start per second; 0 starts them all at once.
	Rate float64
	// MaxConcurrent bounds the conversations running at once. Default 64.
	MaxConcurrent int
	// Timeout bounds each request. Default 2m.
	Timeout time.Duration
	// Model is the `model` of each request. Default Model.
	Model string
	// Host, when set, is each request's Host header (a Gateway's route by hostname).
	Host string
	// ThinkTime is how long a conversation waits after an answer before its
	// next turn, as a person reads and types. Without it, a client that keeps
	// connections alive sends each turn on the connection its last turn just
	// freed, and a Service (kube-proxy picks a pod per connection) keeps every
	// conversation on one pod, which users with pauses between turns do not get.
	ThinkTime time.Duration
}

// Result is what a run measured.
type Result struct {
	TTFTs        []time.Duration
	OutputTokens int
	Requests     int
	Failed       int
	Elapsed      time.Duration
	// FirstError is the first failure, for the report.
	FirstError string
}

// Run sends the conversations and measures each request's time to first
// token (the first streamed content) and its output tokens.
func Run(ctx context.Context, convs []Conversation, o RunOptions) Result {
	if o.MaxConcurrent <= 0 {
		o.MaxConcurrent = 64
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Minute
	}
	if o.Model == "" {
		o.Model = Model
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.MaxConcurrent, MaxIdleConns: 4 * o.MaxConcurrent}}
	var next atomic.Uint64
	var mu sync.Mutex
	var res Result
	sem := make(chan struct{}, o.MaxConcurrent)
	var wg sync.WaitGroup
	begin := time.Now()
	for i, conv := range convs {
		if o.Rate > 0 {
			start := begin.Add(time.Duration(float64(i) / o.Rate * float64(time.Second)))
			select {
			case <-ctx.Done():
			case <-time.After(time.Until(start)):
			}
		}
		select {
		case <-ctx.Done():
		case sem <- struct{}{}:
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			messages := []chatMessage{{Role: "system", Content: conv.System}}
			for _, turn := range conv.Turns {
				messages = append(messages, chatMessage{Role: "user", Content: turn})
				target := o.Targets[next.Add(1)%uint64(len(o.Targets))]
				ttft, answer, tokens, err := chatAsQueued(ctx, client, target, o, messages, conv.MaxTokens)
				mu.Lock()
				res.Requests++
				if err != nil {
					res.Failed++
					if res.FirstError == "" {
						res.FirstError = err.Error()
					}
				} else {
					res.TTFTs = append(res.TTFTs, ttft)
					res.OutputTokens += tokens
				}
				mu.Unlock()
				if err != nil {
					return // the rest of the conversation has no history to send
				}
				messages = append(messages, chatMessage{Role: "assistant", Content: answer})
				select {
				case <-ctx.Done():
				case <-time.After(o.ThinkTime):
				}
			}
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(begin)
	return res
}

// kvCacheFull is how llm-d-inference-sim refuses a request its KV cache
// cannot hold beside the running ones (HTTP 500).
const kvCacheFull = "the kv cache does not have sufficient capacity"

// queuePoll is how often a request the simulator refused for want of KV
// cache is sent again.
const queuePoll = 20 * time.Millisecond

// chatAsQueued is chat, with the simulator's refusal for want of KV cache
// turned into the wait vLLM makes: vLLM admits a request only when its cache
// can hold it and keeps the rest in its waiting queue, where the simulator
// refuses them. So a refused request is sent again to the same target every
// queuePoll until it is taken or o.Timeout has passed since it was first
// sent, and its time to first token counts from then.
func chatAsQueued(ctx context.Context, client *http.Client, target string, o RunOptions, messages []chatMessage, maxTokens int) (time.Duration, string, int, error) {
	first := time.Now()
	for {
		sent := time.Now()
		ttft, answer, tokens, err := chat(ctx, client, target, o.Host, o.Model, messages, maxTokens, o.Timeout)
		if err == nil {
			return sent.Sub(first) + ttft, answer, tokens, nil
		}
		if !strings.Contains(err.Error(), kvCacheFull) || time.Since(first) > o.Timeout {
			return 0, "", 0, err
		}
		select {
		case <-ctx.Done():
			return 0, "", 0, ctx.Err()
		case <-time.After(queuePoll):
		}
	}
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chat sends one streaming chat completion and reads it to the end.
func chat(ctx context.Context, client *http.Client, base, host, model string, messages []chatMessage, maxTokens int, timeout time.Duration) (time.Duration, string, int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	body, _ := json.Marshal(map[string]any{
		"model": model, "messages": messages, "max_tokens": maxTokens, "stream": true, "ignore_eos": true,
		"stream_options": map[string]any{"include_usage": true},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, "", 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Host = host
	begin := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, "", 0, fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
	}
	var ttft time.Duration
	var answer strings.Builder
	chunks, usageTokens := 0, -1
	scanner := bufio.NewScanner(resp.Body)
	scanner.Buffer(make([]byte, 64<<10), 1<<20)
	for scanner.Scan() {
		data, ok := bytes.CutPrefix(scanner.Bytes(), []byte("data: "))
		if !ok || bytes.Equal(data, []byte("[DONE]")) {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(data, &chunk); err != nil {
			return 0, "", 0, fmt.Errorf("a chunk that is not JSON: %.200s", data)
		}
		if chunk.Error != nil {
			return 0, "", 0, fmt.Errorf("error event: %s", chunk.Error.Message)
		}
		if chunk.Usage != nil {
			usageTokens = chunk.Usage.CompletionTokens
		}
		for _, c := range chunk.Choices {
			if c.Delta.Content != "" {
				if ttft == 0 {
					ttft = time.Since(begin)
				}
				chunks++
				answer.WriteString(c.Delta.Content)
			}
		}
	}
	if err := scanner.Err(); err != nil {
		return 0, "", 0, err
	}
	if ttft == 0 {
		return 0, "", 0, fmt.Errorf("the stream ended with no content")
	}
	if usageTokens < 0 {
		usageTokens = chunks
	}
	return ttft, answer.String(), usageTokens, nil
}

// Summary is one way of routing's figures.
type Summary struct {
	Name             string
	P50, P90, P99    time.Duration
	TokensPerSecond  float64
	Requests, Failed int
	// HitShare is the simulators' prefix-cache hits over queries (tokens).
	HitShare float64
}

// Summarize makes the figures of a run from its result and the simulators'
// counters before and after it.
func Summarize(name string, r Result, counters Counters) Summary {
	s := Summary{Name: name, Requests: r.Requests, Failed: r.Failed}
	ttfts := slices.Clone(r.TTFTs)
	slices.Sort(ttfts)
	at := func(q float64) time.Duration {
		if len(ttfts) == 0 {
			return 0
		}
		return ttfts[min(len(ttfts)-1, int(q*float64(len(ttfts))))]
	}
	s.P50, s.P90, s.P99 = at(0.5), at(0.9), at(0.99)
	if r.Elapsed > 0 {
		s.TokensPerSecond = float64(r.OutputTokens) / r.Elapsed.Seconds()
	}
	if counters.PrefixQueries > 0 {
		s.HitShare = counters.PrefixHits / counters.PrefixQueries
	}
	return s
}

// PrintTable prints the summaries side by side.
func PrintTable(w io.Writer, header string, rows ...Summary) {
	_, _ = fmt.Fprintln(w, header)
	_, _ = fmt.Fprintf(w, "%-22s %10s %10s %10s %12s %9s %8s %10s\n", "routing", "TTFT p50", "TTFT p90", "TTFT p99", "out tok/s", "requests", "failed", "hit share")
	for _, r := range rows {
		_, _ = fmt.Fprintf(w, "%-22s %10s %10s %10s %12.1f %9d %8d %9.1f%%\n", r.Name,
			r.P50.Round(time.Millisecond), r.P90.Round(time.Millisecond), r.P99.Round(time.Millisecond),
			r.TokensPerSecond, r.Requests, r.Failed, 100*r.HitShare)
	}
}
