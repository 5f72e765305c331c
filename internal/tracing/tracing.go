// Package tracing sends the operator's reconcile traces to an OTLP endpoint
// (an OpenTelemetry Collector, Jaeger, Tempo). Off unless an endpoint is given:
// then the global tracer provider stays OpenTelemetry's no-op one and spans cost
// nothing.
package tracing

import (
	"context"
	"net/url"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// otlpGRPCPort is where OTLP receivers serve gRPC by default: an endpoint
// there most likely still names the receiver of an older operator's exporter.
const otlpGRPCPort = "4317"

// ServiceName names the operator in traces.
const ServiceName = "aiinference-operator"

// Options configure the exporter.
type Options struct {
	// Endpoint is the OTLP/HTTP receiver, host:port (traces go to
	// /v1/traces) or a URL; empty turns tracing off.
	Endpoint string
	// Insecure sends to host:port over plain HTTP (a collector on the same node
	// or in the cluster); a URL says its scheme itself.
	Insecure bool
	// SampleRatio is the share of reconciles traced, 0 to 1.
	SampleRatio float64
}

// Setup installs the global tracer provider and returns its shutdown, which
// flushes the spans not sent yet. With no endpoint it does nothing.
func Setup(_ context.Context, opts Options) (shutdown func(context.Context) error, err error) {
	if opts.Endpoint == "" {
		return func(context.Context) error { return nil }, nil
	}
	exporter, err := newOTLPExporter(opts)
	if err != nil {
		return nil, err
	}
	log := logf.Log.WithName("tracing")
	if u, err := url.Parse(exporter.url); err == nil && u.Port() == otlpGRPCPort {
		log.Info("The OTLP endpoint's port is OTLP/gRPC's; the operator sends OTLP/HTTP, which receivers serve on 4318 by default", "url", exporter.url)
	}
	ratio := opts.SampleRatio
	if ratio <= 0 || ratio > 1 {
		ratio = 1
	}
	provider := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exporter),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
		sdktrace.WithResource(resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName(ServiceName))),
	)
	otel.SetTracerProvider(provider)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	// A batch the receiver did not take is dropped; say so in the operator's log
	// (OpenTelemetry's default handler prints to stderr in another format).
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Error(err, "Traces not sent; the batch is dropped")
	}))
	return provider.Shutdown, nil
}
