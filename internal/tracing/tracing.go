// Package tracing sends the operator's reconcile traces to an OTLP endpoint
// (an OpenTelemetry Collector, Jaeger, Tempo). Off unless an endpoint is given:
// then the global tracer provider stays OpenTelemetry's no-op one and spans cost
// nothing.
package tracing

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
)

// ServiceName names the operator in traces.
const ServiceName = "aiinference-operator"

// Options configure the exporter.
type Options struct {
	// Endpoint is the OTLP gRPC endpoint, host:port; empty turns tracing off.
	Endpoint string
	// Insecure sends without TLS (a collector on the same node or in the cluster).
	Insecure bool
	// SampleRatio is the share of reconciles traced, 0 to 1.
	SampleRatio float64
}

// Setup installs the global tracer provider and returns its shutdown, which
// flushes the spans not sent yet. With no endpoint it does nothing.
func Setup(ctx context.Context, opts Options) (shutdown func(context.Context) error, err error) {
	if opts.Endpoint == "" {
		return func(context.Context) error { return nil }, nil
	}
	clientOpts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(opts.Endpoint), otlptracegrpc.WithTimeout(10 * time.Second)}
	if opts.Insecure {
		clientOpts = append(clientOpts, otlptracegrpc.WithInsecure())
	}
	exporter, err := otlptracegrpc.New(ctx, clientOpts...)
	if err != nil {
		return nil, fmt.Errorf("creating the OTLP exporter: %w", err)
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
	return provider.Shutdown, nil
}
