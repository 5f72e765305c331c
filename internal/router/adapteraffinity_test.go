package router

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Among the replicas that serve an adapter, a request for it goes where the
// adapter is active in the engine (vllm:lora_requests_info), whatever its
// prompt's owner on the ring; past the load bound there, or with no fresh
// reading, to a replica with room for one more active adapter before a full
// one. A prefix cached on a replica still comes first, and base-model
// requests are not held by it.
func TestAnAdapterRequestPrefersReplicasWhereItIsActive(t *testing.T) {
	eps := endpoints(3)
	active, room, full := eps[0].Name, eps[1].Name, eps[2].Name
	p := NewPicker(PickerOptions{MinBound: 2, LoadFactor: 1.01})
	clock := time.Now()
	p.now = func() time.Time { return clock }
	p.SetEngineLoad(active, EngineLoad{Running: 0, Adapters: AdapterActivity{Known: true, Active: []string{"sql-lora"}, Max: 2}, At: clock})
	p.SetEngineLoad(room, EngineLoad{Adapters: AdapterActivity{Known: true, Active: []string{"chat-lora"}, Max: 2}, At: clock})
	p.SetEngineLoad(full, EngineLoad{Adapters: AdapterActivity{Known: true, Active: []string{"chat-lora", "docs-lora"}, Max: 2}, At: clock})

	base := map[string]bool{}
	for tenant := range 30 {
		blocks := blockHashes(append([]byte("sql-lora\x00"), prompt(tenant, 0, 1)...), 256)
		pk, _ := p.PickForAdapter(eps, blocks, "", "sql-lora")
		p.Done(pk.Endpoint.Name)
		if pk.Endpoint.Name != active || pk.Reason != ReasonAdapter {
			t.Fatalf("tenant %d: sql-lora went to %s (%s), want %s (adapter), where it is active", tenant, pk.Endpoint.Name, pk.Reason, active)
		}
		bk, _ := p.Pick(eps, blockHashes(prompt(tenant, 1, 1), 256), "")
		p.Done(bk.Endpoint.Name)
		base[bk.Endpoint.Name] = true
	}
	if len(base) < 2 {
		t.Errorf("base-model requests all went to %v: the adapter's preference must not hold for them", base)
	}

	// A prefix this router sent elsewhere before wins over the preference.
	cached := blockHashes(append([]byte("sql-lora\x00"), prompt(99, 0, 1)...), 256)
	p.index.add(cached, full)
	if pk, _ := p.PickForAdapter(eps, cached, "", "sql-lora"); pk.Endpoint.Name != full || pk.Reason != ReasonPrefix {
		t.Errorf("a cached prefix went to %s (%s), want %s (prefix)", pk.Endpoint.Name, pk.Reason, full)
	} else {
		p.Done(pk.Endpoint.Name)
	}

	// Past the bound where it is active: to the replica with room, never the full one.
	p.SetEngineLoad(active, EngineLoad{Running: 6, Adapters: AdapterActivity{Known: true, Active: []string{"sql-lora"}, Max: 2}, At: clock})
	for tenant := range 10 {
		blocks := blockHashes(append([]byte("sql-lora\x00"), prompt(100+tenant, 0, 1)...), 256)
		pk, _ := p.PickForAdapter(eps, blocks, "", "sql-lora")
		p.Done(pk.Endpoint.Name)
		if pk.Endpoint.Name != room {
			t.Fatalf("with %s past the bound, tenant %d went to %s (%s), want %s, which has room for the adapter", active, tenant, pk.Endpoint.Name, pk.Reason, room)
		}
	}

	// Readings older than StaleAfter count for nothing: the ring decides.
	clock = clock.Add(time.Minute)
	reasons := map[string]int{}
	for tenant := range 10 {
		blocks := blockHashes(append([]byte("sql-lora\x00"), prompt(200+tenant, 0, 1)...), 256)
		pk, _ := p.PickForAdapter(eps, blocks, "", "sql-lora")
		p.Done(pk.Endpoint.Name)
		reasons[pk.Reason]++
	}
	if reasons[ReasonAdapter] != 0 {
		t.Errorf("stale readings still steer: reasons %v", reasons)
	}
}

// Two routers that share nothing pick the same replica among several where
// the adapter is active.
func TestTwoPickersAgreeAmongReplicasWhereAnAdapterIsActive(t *testing.T) {
	eps := endpoints(4)
	a, b := NewPicker(PickerOptions{}), NewPicker(PickerOptions{})
	now := time.Now()
	for _, p := range []*Picker{a, b} {
		for _, e := range eps[:3] {
			p.SetEngineLoad(e.Name, EngineLoad{Adapters: AdapterActivity{Known: true, Active: []string{"sql-lora"}, Max: 4}, At: now})
		}
	}
	used := map[string]int{}
	for tenant := range 60 {
		blocks := blockHashes(append([]byte("sql-lora\x00"), prompt(tenant, 0, 1)...), 256)
		pa, _ := a.PickForAdapter(eps, blocks, "", "sql-lora")
		pb, _ := b.PickForAdapter(eps, blocks, "", "sql-lora")
		a.Done(pa.Endpoint.Name)
		b.Done(pb.Endpoint.Name)
		if pa.Endpoint.Name != pb.Endpoint.Name || pa.Reason != ReasonAdapter {
			t.Fatalf("tenant %d: router a picked %s (%s), router b %s (%s)", tenant, pa.Endpoint.Name, pa.Reason, pb.Endpoint.Name, pb.Reason)
		}
		used[pa.Endpoint.Name]++
	}
	if len(used) != 3 || used[eps[3].Name] != 0 {
		t.Errorf("60 prompts went to %v, want the 3 replicas where the adapter is active", used)
	}
}

// vllm:lora_requests_info keeps a series per state it was in; the latest
// (largest value, a time) is the engine's state now. Text as
// llm-d-inference-sim v0.10.2 exports it (metrics.go, reportLoras).
func TestAdapterActivityReadsTheLatestSeries(t *testing.T) {
	text := `# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.796581e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql-lora",waiting_lora_adapters=""} 1.796581002e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql-lora,chat-lora",waiting_lora_adapters="docs-lora"} 1.796581005e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="chat-lora",waiting_lora_adapters=""} 1.796581003e+09
`
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	got := adapterActivity(families[loraInfoMetric])
	if !got.Known || got.Max != 2 || !slices.Equal(got.Active, []string{"chat-lora", "docs-lora", "sql-lora"}) {
		t.Errorf("read %+v, want known, max 2, active chat-lora, docs-lora, sql-lora", got)
	}
	if got.room() || !got.has("docs-lora") || got.has("base") {
		t.Errorf("%+v: room %v, has docs-lora %v, has base %v", got, got.room(), got.has("docs-lora"), got.has("base"))
	}
	// The simulator sets whole seconds: series of the same second tie, and
	// the adapters of each count.
	tied := `vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.796581e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql-lora",waiting_lora_adapters=""} 1.796581e+09
`
	if families, err = parser.TextToMetricFamilies(strings.NewReader(tied)); err != nil {
		t.Fatal(err)
	}
	if got := adapterActivity(families[loraInfoMetric]); !got.has("sql-lora") || !got.room() {
		t.Errorf("tied series read as %+v, want sql-lora active and room for 3 more", got)
	}
	if none := adapterActivity(families["vllm:num_requests_running"]); none.Known || none.room() {
		t.Errorf("no series read as %+v", none)
	}
}
