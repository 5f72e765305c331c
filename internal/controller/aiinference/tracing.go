package aiinference

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// Reconcile tracing: a span per reconcile ("Reconcile") and one per step beneath
// it, with the object, the decisions taken (a child created, updated, unchanged,
// left alone, or a step skipped, and why) and errors as attributes. The spans go
// nowhere unless the operator was started with an OTLP endpoint (--otlp-endpoint,
// internal/tracing); the reconcile's log lines carry its trace ID.

// TracerName names the controller's tracer.
const TracerName = "github.com/aiinference/operator/internal/controller/aiinference"

var tracer = otel.Tracer(TracerName)

// Span attribute keys.
const (
	attrNamespace  = attribute.Key("aiinference.namespace")
	attrName       = attribute.Key("aiinference.name")
	attrGeneration = attribute.Key("aiinference.generation")
	attrDecision   = attribute.Key("decision")
	attrWhy        = attribute.Key("decision.reason")
	attrChild      = attribute.Key("child")
)

// traced runs fn in a child span of ctx's span; an error marks the span.
func traced(ctx context.Context, name string, fn func(context.Context) error) error {
	ctx, span := tracer.Start(ctx, name)
	defer span.End()
	err := fn(ctx)
	endWith(span, err)
	return err
}

// skipped records a step that did not run, and why.
func skipped(ctx context.Context, name, why string) {
	_, span := tracer.Start(ctx, name)
	span.SetAttributes(attrDecision.String("skipped"), attrWhy.String(why))
	span.End()
}

func endWith(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
}

func (a applyResult) String() string {
	switch a {
	case applyCreated:
		return "created"
	case applyUnchanged:
		return "unchanged"
	case applyUpdated:
		return "updated"
	case applyConflict:
		return "leftAlone"
	}
	return "unknown"
}

// recordApply puts what apply decided for a child on the step's span.
func recordApply(ctx context.Context, child client.Object, res applyResult, err error) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	kind := child.GetObjectKind().GroupVersionKind().Kind
	attrs := []attribute.KeyValue{attrChild.String(kind + "/" + child.GetName())}
	switch {
	case err != nil:
		attrs = append(attrs, attrDecision.String("failed"))
	case res == applyConflict:
		attrs = append(attrs, attrDecision.String(res.String()), attrWhy.String("an object of that name is not controlled by this AIInference"))
	case res == applyUpdated:
		attrs = append(attrs, attrDecision.String(res.String()), attrWhy.String("the desired state changed (the spec, or the loaders' budget) or the child was edited by hand"))
	default:
		attrs = append(attrs, attrDecision.String(res.String()))
	}
	span.SetAttributes(attrs...)
}

// recordLoads puts the load assessment on the observe step's span.
func recordLoads(ctx context.Context, s *scope) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	current := 0
	for _, p := range s.obs.pods {
		if p.Current {
			current++
		}
	}
	span.SetAttributes(
		attribute.Int("pods", len(s.obs.pods)), attribute.Int("pods.current", current),
		attribute.Int("loads.failed", int(s.loads.failed)), attribute.String("loads.halted", s.loads.halted()),
		attribute.Int("pods.toReplace", len(s.loads.deletePods)), attribute.String("requeueAfter", s.loads.requeue.Round(time.Second).String()),
		attribute.Bool("deployment.exists", s.obs.deployment != nil),
	)
	if s.loads.newFailure && s.loads.failure != nil {
		span.AddEvent("loadFailed", trace.WithAttributes(attribute.String("reason", s.loads.failure.Reason),
			attribute.String("pod", s.loads.failure.Pod), attribute.Bool("retried", s.loads.failure.Retried)))
	}
}

// recordStatus puts the status this pass derived on the patchStatus span.
func recordStatus(ctx context.Context, before, after *servingv1.AIInferenceStatus) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{attribute.String("phase", string(after.Phase)), attribute.String("phase.before", string(before.Phase)),
		attribute.Int("replicas.ready", int(after.ReadyReplicas)), attribute.Int("loadRetries", int(after.LoadRetries))}
	if c := meta.FindStatusCondition(after.Conditions, servingv1.ConditionReady); c != nil {
		attrs = append(attrs, attribute.String("ready.status", string(c.Status)), attribute.String("ready.reason", c.Reason))
	}
	decision := "written"
	if equality.Semantic.DeepEqual(*before, *after) {
		decision = "unchanged"
	}
	span.SetAttributes(append(attrs, attrDecision.String(decision))...)
}
