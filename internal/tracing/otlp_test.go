package tracing

import (
	"context"
	"encoding/hex"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protojson"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/aiinference/operator/test/tracingtest"
)

// TestExporterSendsWhatTheSDKRecorded exports a parent and a child span with
// every kind of attribute, an event, a link and an error status, and reads them
// back with the collector's own types.
func TestExporterSendsWhatTheSDKRecorded(t *testing.T) {
	recv, endpoint := tracingtest.Start(t)
	exporter, err := newOTLPExporter(Options{Endpoint: endpoint, Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	provider := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", ServiceName))))
	tracer := provider.Tracer("test-scope", trace.WithInstrumentationVersion("v9"))
	ctx, parent := tracer.Start(context.Background(), "parent")
	linked := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled, Remote: true})
	_, child := tracer.Start(ctx, "child", trace.WithSpanKind(trace.SpanKindServer), trace.WithLinks(trace.Link{SpanContext: linked}))
	child.SetAttributes(attribute.Bool("b", true), attribute.Int("i", 7), attribute.Float64("f", 1.5), attribute.String("s", "x"),
		attribute.StringSlice("ss", []string{"a", "b"}), attribute.Int64Slice("is", []int64{1, 2}))
	child.AddEvent("loadFailed", trace.WithAttributes(attribute.String("reason", "NotFound")))
	child.SetStatus(codes.Error, "the bucket is gone")
	child.End()
	parent.End()
	if err := provider.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}

	reqs := recv.Requests()
	if len(reqs) != 2 {
		t.Fatalf("got %d requests, want one per span (a syncer)", len(reqs))
	}
	rs := reqs[0].ResourceSpans
	if len(rs) != 1 || len(rs[0].ScopeSpans) != 1 || len(rs[0].ScopeSpans[0].Spans) != 1 {
		t.Fatalf("want one resource, scope and span: %s", protojson.Format(reqs[0]))
	}
	if a := rs[0].Resource.Attributes; len(a) != 1 || a[0].Key != "service.name" || a[0].Value.GetStringValue() != ServiceName {
		t.Errorf("resource attributes: %v", a)
	}
	if s := rs[0].ScopeSpans[0].Scope; s.Name != "test-scope" || s.Version != "v9" {
		t.Errorf("scope: %v", s)
	}
	got := rs[0].ScopeSpans[0].Spans[0]
	parentSC, childSC := parent.SpanContext(), child.SpanContext()
	if got.Name != "child" || hex.EncodeToString(got.TraceId) != parentSC.TraceID().String() ||
		hex.EncodeToString(got.SpanId) != childSC.SpanID().String() || hex.EncodeToString(got.ParentSpanId) != parentSC.SpanID().String() {
		t.Errorf("ids: %s", protojson.Format(got))
	}
	if got.Kind != tracepb.Span_SPAN_KIND_SERVER || got.StartTimeUnixNano == 0 || got.EndTimeUnixNano < got.StartTimeUnixNano {
		t.Errorf("kind or times: %s", protojson.Format(got))
	}
	if got.Flags != 0x101 { // sampled, parent known to be local
		t.Errorf("flags %#x, want 0x101", got.Flags)
	}
	if got.Status.Code != tracepb.Status_STATUS_CODE_ERROR || got.Status.Message != "the bucket is gone" {
		t.Errorf("status: %v", got.Status)
	}
	want := map[string]string{"b": `{"boolValue":true}`, "i": `{"intValue":"7"}`, "f": `{"doubleValue":1.5}`, "s": `{"stringValue":"x"}`,
		"ss": `{"arrayValue":{"values":[{"stringValue":"a"},{"stringValue":"b"}]}}`, "is": `{"arrayValue":{"values":[{"intValue":"1"},{"intValue":"2"}]}}`}
	for _, kv := range got.Attributes {
		if js := compactJSON(kv.Value); js != want[kv.Key] {
			t.Errorf("attribute %s = %s, want %s", kv.Key, js, want[kv.Key])
		}
		delete(want, kv.Key)
	}
	if len(want) != 0 {
		t.Errorf("attributes not sent: %v", want)
	}
	if len(got.Events) != 1 || got.Events[0].Name != "loadFailed" || got.Events[0].Attributes[0].Value.GetStringValue() != "NotFound" {
		t.Errorf("events: %v", got.Events)
	}
	if len(got.Links) != 1 || hex.EncodeToString(got.Links[0].SpanId) != linked.SpanID().String() || got.Links[0].Flags != 0x301 {
		t.Errorf("links: %v", got.Links)
	}
	if p := reqs[1].ResourceSpans[0].ScopeSpans[0].Spans[0]; p.Name != "parent" || len(p.ParentSpanId) != 0 || p.Status.Code != tracepb.Status_STATUS_CODE_UNSET {
		t.Errorf("parent span: %s", protojson.Format(p))
	}
}

func compactJSON(v *commonpb.AnyValue) string {
	b, _ := protojson.MarshalOptions{}.Marshal(v)
	return strings.ReplaceAll(string(b), " ", "")
}

// TestExporterRetriesWhatTheReceiverCouldNotTake: a 503 and a 429 are retried; a
// 400 is an error that says what the receiver answered, and is not retried.
func TestExporterRetriesWhatTheReceiverCouldNotTake(t *testing.T) {
	recv, endpoint := tracingtest.Start(t)
	exporter, err := newOTLPExporter(Options{Endpoint: endpoint, Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	provider := sdktrace.NewTracerProvider()
	_, span := provider.Tracer("t").Start(context.Background(), "s")
	span.End()
	spans := []sdktrace.ReadOnlySpan{span.(sdktrace.ReadOnlySpan)}

	recv.Refuse(http.StatusServiceUnavailable, http.StatusTooManyRequests)
	if err := exporter.ExportSpans(context.Background(), spans); err != nil {
		t.Fatalf("export after a 503 and a 429: %v", err)
	}
	if recv.Posts() != 3 || len(recv.Spans()) != 1 {
		t.Errorf("%d posts and %d spans received, want 3 and 1", recv.Posts(), len(recv.Spans()))
	}

	recv.Refuse(http.StatusBadRequest)
	err = exporter.ExportSpans(context.Background(), spans)
	if err == nil || !strings.Contains(err.Error(), "400 Bad Request: refused by the test") {
		t.Errorf("export refused with a 400: %v", err)
	}
	if recv.Posts() != 4 {
		t.Errorf("%d posts, want the 400 not retried", recv.Posts())
	}
}

func TestTracesURL(t *testing.T) {
	for _, c := range []struct {
		endpoint string
		insecure bool
		want     string
	}{
		{"otel-collector.observability:4318", false, "https://otel-collector.observability:4318/v1/traces"},
		{"otel-collector.observability:4318", true, "http://otel-collector.observability:4318/v1/traces"},
		{"http://tempo:4318", false, "http://tempo:4318/v1/traces"},
		{"https://gateway.example/otlp/v1/traces", true, "https://gateway.example/otlp/v1/traces"},
		{"grpc://collector:4317", false, ""},
		{"://", false, ""},
	} {
		got, err := tracesURL(c.endpoint, c.insecure)
		if got != c.want || (err != nil) != (c.want == "") {
			t.Errorf("tracesURL(%q, %v) = %q, %v; want %q", c.endpoint, c.insecure, got, err, c.want)
		}
	}
}

var (
	setLoggerOnce sync.Once
	testLog       = make(chan string, 100)
)

// TestSetupLogsWhatWasNotSent: an endpoint on OTLP/gRPC's port is pointed out,
// and a batch the receiver refuses is dropped with an error in the operator's log.
func TestSetupLogsWhatWasNotSent(t *testing.T) {
	// controller-runtime takes the first logger set in a process only.
	var logged []string
	setLoggerOnce.Do(func() {
		logf.SetLogger(funcr.New(func(prefix, args string) { testLog <- prefix + " " + args }, funcr.Options{}))
	})
	drain := func() {
		for {
			select {
			case line := <-testLog:
				logged = append(logged, line)
			default:
				return
			}
		}
	}
	shutdown, err := Setup(context.Background(), Options{Endpoint: "collector.invalid:4317", Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	_ = shutdown(context.Background())
	drain()
	if len(logged) != 1 || !strings.Contains(logged[0], "OTLP/gRPC's") || !strings.Contains(logged[0], "http://collector.invalid:4317/v1/traces") {
		t.Errorf("log for an endpoint on 4317: %q", logged)
	}
	logged = nil

	recv, endpoint := tracingtest.Start(t)
	recv.Refuse(http.StatusBadRequest)
	shutdown, err = Setup(context.Background(), Options{Endpoint: endpoint, Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	_, span := otel.Tracer("t").Start(context.Background(), "s")
	span.End()
	_ = shutdown(context.Background())
	drain()
	if len(logged) != 1 || !strings.Contains(logged[0], "Traces not sent") || !strings.Contains(logged[0], "400 Bad Request") {
		t.Errorf("log: %q", logged)
	}
}
