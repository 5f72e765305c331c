package tracing

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/wait"
)

// otlpExporter sends spans to an OTLP/HTTP receiver: a POST of an
// ExportTraceServiceRequest in protobuf to /v1/traces. OpenTelemetry's own OTLP
// exporters (gRPC and HTTP alike) link gRPC and the collector's generated
// services, which cost the operator about 12 MiB of resident memory with tracing
// off (docs/performance.md); the request is one repeated field around the trace
// messages, which are used as generated.
type otlpExporter struct {
	url    string
	client *http.Client
}

const (
	// exportTimeout bounds one batch's export, its retries included.
	exportTimeout = 10 * time.Second
	// maxErrorBody is how much of a refusal's body an error quotes.
	maxErrorBody = 256
)

// exportBackoff spaces the retries of a batch the receiver could not take (a
// 429, a 502-504 or a failed connection), within exportTimeout.
var exportBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 5, Cap: 4 * time.Second}

func newOTLPExporter(opts Options) (*otlpExporter, error) {
	u, err := tracesURL(opts.Endpoint, opts.Insecure)
	if err != nil {
		return nil, err
	}
	return &otlpExporter{url: u, client: &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}}, nil
}

// tracesURL is the receiver's traces URL: from host:port (https, or http when
// insecure) or from a URL, whose path defaults to /v1/traces.
func tracesURL(endpoint string, insecure bool) (string, error) {
	raw := endpoint
	if !strings.Contains(raw, "://") {
		scheme := "https"
		if insecure {
			scheme = "http"
		}
		raw = scheme + "://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return "", fmt.Errorf("OTLP endpoint %q: want host:port (e.g. otel-collector.observability:4318) or an http(s) URL", endpoint)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/traces"
	}
	return u.String(), nil
}

// ExportSpans sends one batch, retrying what the receiver could not take.
func (e *otlpExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if len(spans) == 0 {
		return nil
	}
	body, err := marshalTraces(spans)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, exportTimeout)
	defer cancel()
	backoff := exportBackoff
	for {
		retryAfter, err := e.post(ctx, body)
		if err == nil || retryAfter < 0 || backoff.Steps <= 1 {
			return err
		}
		delay := max(backoff.Step(), retryAfter)
		select {
		case <-ctx.Done():
			return fmt.Errorf("exporting %d spans: %w", len(spans), err)
		case <-time.After(delay):
		}
	}
}

// post sends the request once. On an error, retryAfter is how long to wait
// before trying again (0: the back-off's step), or negative when the receiver
// refused the batch for good.
func (e *otlpExporter) post(ctx context.Context, body []byte) (retryAfter time.Duration, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, bytes.NewReader(body))
	if err != nil {
		return -1, err
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	resp, err := e.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	if resp.StatusCode/100 == 2 {
		return 0, nil
	}
	err = fmt.Errorf("OTLP receiver %s answered %s: %s", e.url, resp.Status, strings.TrimSpace(string(msg)))
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		seconds, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		return time.Duration(seconds) * time.Second, err
	}
	return -1, err
}

// Shutdown closes the exporter's idle connections; the batcher has flushed by then.
func (e *otlpExporter) Shutdown(context.Context) error {
	e.client.CloseIdleConnections()
	return nil
}

// marshalTraces encodes an ExportTraceServiceRequest: the spans grouped by
// resource, then by instrumentation scope, as field 1 (resource_spans).
func marshalTraces(spans []sdktrace.ReadOnlySpan) ([]byte, error) {
	type scopeKey struct {
		resource                 attribute.Distinct
		name, version, schemaURL string
		attributes               attribute.Distinct
	}
	var ordered []*tracepb.ResourceSpans
	resources := map[attribute.Distinct]*tracepb.ResourceSpans{}
	scopes := map[scopeKey]*tracepb.ScopeSpans{}
	for _, s := range spans {
		res := s.Resource()
		rs := resources[res.Equivalent()]
		if rs == nil {
			rs = &tracepb.ResourceSpans{Resource: &resourcepb.Resource{Attributes: keyValues(res.Attributes())}, SchemaUrl: res.SchemaURL()}
			resources[res.Equivalent()] = rs
			ordered = append(ordered, rs)
		}
		scope := s.InstrumentationScope()
		key := scopeKey{res.Equivalent(), scope.Name, scope.Version, scope.SchemaURL, scope.Attributes.Equivalent()}
		ss := scopes[key]
		if ss == nil {
			ss = &tracepb.ScopeSpans{SchemaUrl: scope.SchemaURL, Scope: &commonpb.InstrumentationScope{
				Name: scope.Name, Version: scope.Version, Attributes: keyValues(scope.Attributes.ToSlice()),
			}}
			scopes[key] = ss
			rs.ScopeSpans = append(rs.ScopeSpans, ss)
		}
		ss.Spans = append(ss.Spans, spanMessage(s))
	}
	var out []byte
	for _, rs := range ordered {
		b, err := proto.Marshal(rs)
		if err != nil {
			return nil, fmt.Errorf("encoding spans: %w", err)
		}
		out = protowire.AppendTag(out, 1, protowire.BytesType)
		out = protowire.AppendBytes(out, b)
	}
	return out, nil
}

func spanMessage(s sdktrace.ReadOnlySpan) *tracepb.Span {
	sc := s.SpanContext()
	traceID, spanID := sc.TraceID(), sc.SpanID()
	m := &tracepb.Span{
		TraceId:                traceID[:],
		SpanId:                 spanID[:],
		TraceState:             sc.TraceState().String(),
		Flags:                  spanFlags(sc, s.Parent().IsRemote()),
		Name:                   s.Name(),
		Kind:                   tracepb.Span_SpanKind(s.SpanKind()), // the same numbers, unspecified to consumer
		StartTimeUnixNano:      unixNano(s.StartTime()),
		EndTimeUnixNano:        unixNano(s.EndTime()),
		Attributes:             keyValues(s.Attributes()),
		DroppedAttributesCount: uint32(s.DroppedAttributes()),
		DroppedEventsCount:     uint32(s.DroppedEvents()),
		DroppedLinksCount:      uint32(s.DroppedLinks()),
		Status:                 &tracepb.Status{Code: statusCode(s.Status().Code), Message: s.Status().Description},
	}
	if parent := s.Parent(); parent.SpanID().IsValid() {
		id := parent.SpanID()
		m.ParentSpanId = id[:]
	}
	for _, ev := range s.Events() {
		m.Events = append(m.Events, &tracepb.Span_Event{
			Name: ev.Name, TimeUnixNano: unixNano(ev.Time), Attributes: keyValues(ev.Attributes), DroppedAttributesCount: uint32(ev.DroppedAttributeCount),
		})
	}
	for _, link := range s.Links() {
		lt, ls := link.SpanContext.TraceID(), link.SpanContext.SpanID()
		m.Links = append(m.Links, &tracepb.Span_Link{
			TraceId: lt[:], SpanId: ls[:], TraceState: link.SpanContext.TraceState().String(),
			Flags:      spanFlags(link.SpanContext, link.SpanContext.IsRemote()),
			Attributes: keyValues(link.Attributes), DroppedAttributesCount: uint32(link.DroppedAttributeCount),
		})
	}
	return m
}

// spanFlags are the W3C trace flags and whether the parent (or linked span) is remote.
func spanFlags(sc trace.SpanContext, remote bool) uint32 {
	flags := uint32(sc.TraceFlags()) | uint32(tracepb.SpanFlags_SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK)
	if remote {
		flags |= uint32(tracepb.SpanFlags_SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK)
	}
	return flags
}

func statusCode(c codes.Code) tracepb.Status_StatusCode {
	switch c {
	case codes.Ok:
		return tracepb.Status_STATUS_CODE_OK
	case codes.Error:
		return tracepb.Status_STATUS_CODE_ERROR
	}
	return tracepb.Status_STATUS_CODE_UNSET
}

func unixNano(t time.Time) uint64 {
	if t.IsZero() {
		return 0
	}
	return uint64(t.UnixNano())
}

func keyValues(attrs []attribute.KeyValue) []*commonpb.KeyValue {
	if len(attrs) == 0 {
		return nil
	}
	out := make([]*commonpb.KeyValue, len(attrs))
	for i, kv := range attrs {
		out[i] = &commonpb.KeyValue{Key: string(kv.Key), Value: anyValue(kv.Value)}
	}
	return out
}

func anyValue(v attribute.Value) *commonpb.AnyValue {
	switch v.Type() {
	case attribute.BOOL:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: v.AsBool()}}
	case attribute.INT64:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v.AsInt64()}}
	case attribute.FLOAT64:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: v.AsFloat64()}}
	case attribute.STRING:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v.AsString()}}
	case attribute.BYTESLICE:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_BytesValue{BytesValue: v.AsByteSlice()}}
	case attribute.BOOLSLICE:
		return arrayValue(v.AsBoolSlice(), attribute.BoolValue)
	case attribute.INT64SLICE:
		return arrayValue(v.AsInt64Slice(), attribute.Int64Value)
	case attribute.FLOAT64SLICE:
		return arrayValue(v.AsFloat64Slice(), attribute.Float64Value)
	case attribute.STRINGSLICE:
		return arrayValue(v.AsStringSlice(), attribute.StringValue)
	case attribute.SLICE:
		return arrayValue(v.AsSlice(), func(v attribute.Value) attribute.Value { return v })
	}
	return &commonpb.AnyValue{} // EMPTY: a key with no value
}

func arrayValue[T any](values []T, wrap func(T) attribute.Value) *commonpb.AnyValue {
	array := &commonpb.ArrayValue{Values: make([]*commonpb.AnyValue, len(values))}
	for i, v := range values {
		array.Values[i] = anyValue(wrap(v))
	}
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: array}}
}

var _ sdktrace.SpanExporter = (*otlpExporter)(nil)
