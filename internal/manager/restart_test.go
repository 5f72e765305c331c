package manager

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/test/testutil"
)

// TestUnansweredObjectsGoFirstAfterARestart starts the operator (one worker) on
// a namespace of objects it has reconciled before and one created while it was
// down, named to be listed last: the new object's pass comes first. Each pass
// starts a Reconcile span (internal/controller/aiinference's tracing), so the
// order of those spans is the order of the passes.
func TestUnansweredObjectsGoFirstAfterARestart(t *testing.T) {
	cfg, _ := testutil.StartEnvtest(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := testutil.NewClient(t, cfg, Scheme())
	const ns = "restart"
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	create := func(name string) {
		t.Helper()
		if err := admin.Create(ctx, testutil.S3Secret(ns, name)); err != nil {
			t.Fatal(err)
		}
		obj := namespacedInference(ns)
		obj.Name = name
		obj.Spec.Model.Source.S3.CredentialsSecretRef.Name = name
		if err := admin.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	answered := func(names ...string) error {
		for _, name := range names {
			var obj servingv1.AIInference
			if err := admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &obj); err != nil {
				return err
			}
			if obj.Status.ObservedGeneration != obj.Generation {
				return fmt.Errorf("%s: status answers generation %d of %d", name, obj.Status.ObservedGeneration, obj.Generation)
			}
		}
		return nil
	}
	var reconciled []string
	for i := range 20 {
		reconciled = append(reconciled, fmt.Sprintf("reconciled-%02d", i))
		create(reconciled[i])
	}
	run(t, ctx, cfg, func() error { return answered(reconciled...) })

	create("unanswered")
	passes := recordPasses()
	run(t, ctx, cfg, func() error { return answered("unanswered") })
	if first := passes.names(); len(first) == 0 || first[0] != "unanswered" {
		t.Errorf("after the restart the operator reconciled %v, in this order: the object no status answered yet waited behind those whose status is current", first)
	}
}

// run runs an operator with one worker until done returns nil.
func run(t *testing.T, ctx context.Context, cfg *rest.Config, done func() error) {
	t.Helper()
	mgr, err := New(cfg, Options{
		MetricsBindAddress: "0", HealthProbeBindAddress: "0", LoaderImage: "example.test/model-loader:test",
		skipNameValidation: true, MaxConcurrentReconciles: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	mgrCtx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- mgr.Start(mgrCtx) }()
	defer func() {
		stop()
		if err := <-stopped; err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	for err := done(); err != nil; err = done() {
		if ctx.Err() != nil {
			t.Fatalf("the operator did not get there: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// passOrder records the names of the objects the controller reconciles, in the
// order their Reconcile spans start.
type passOrder struct {
	mu     sync.Mutex
	passes []string
}

func (o *passOrder) names() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.passes...)
}

func (o *passOrder) OnStart(_ context.Context, span sdktrace.ReadWriteSpan) {
	if span.Name() != "Reconcile" {
		return
	}
	for _, kv := range span.Attributes() {
		if kv.Key == "aiinference.name" {
			o.mu.Lock()
			o.passes = append(o.passes, kv.Value.AsString())
			o.mu.Unlock()
		}
	}
}

func (*passOrder) OnEnd(sdktrace.ReadOnlySpan)      {}
func (*passOrder) Shutdown(context.Context) error   { return nil }
func (*passOrder) ForceFlush(context.Context) error { return nil }

var (
	passes        passOrder
	passesInstall sync.Once
)

// recordPasses starts recording the controller's passes afresh. The controller's
// tracer follows the first tracer provider set in the process, so the recorder
// is installed once.
func recordPasses() *passOrder {
	passesInstall.Do(func() {
		otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(&passes)))
	})
	passes.mu.Lock()
	passes.passes = nil
	passes.mu.Unlock()
	return &passes
}
