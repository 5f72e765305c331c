package aiinference

import (
	"context"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/tracing"
	"github.com/aiinference/operator/test/tracingtest"
)

type nopRecorder struct{}

func (nopRecorder) Eventf(runtime.Object, runtime.Object, string, string, string, string, ...interface{}) {
}
func (nopRecorder) AnnotatedEventf(runtime.Object, runtime.Object, map[string]string, string, string, string, string, ...interface{}) {
}

func attrs(span *tracepb.Span) map[string]string {
	m := map[string]string{}
	for _, kv := range span.Attributes {
		m[kv.Key] = anyValue(kv.Value)
	}
	return m
}

func anyValue(v *commonpb.AnyValue) string {
	switch x := v.Value.(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_BoolValue:
		if x.BoolValue {
			return "true"
		}
		return "false"
	}
	return v.String()
}

// TestReconcileTrace runs one reconcile of a new object with tracing on, and checks
// the spans an OTLP receiver gets: one root span for the reconcile with the object,
// one child per step with its decision, and the trace ID in the log lines.
func TestReconcileTrace(t *testing.T) {
	recv, endpoint := tracingtest.Start(t)
	ctx := context.Background()
	shutdown, err := tracing.Setup(ctx, tracing.Options{Endpoint: endpoint, Insecure: true})
	if err != nil {
		t.Fatal(err)
	}

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(servingv1.AddToScheme(scheme))
	obj := &servingv1.AIInference{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "llm", Generation: 1},
		Spec: servingv1.AIInferenceSpec{
			Model: servingv1.ModelSpec{Name: "llama", Size: ptr.To(resource.MustParse("1Gi")),
				Source: servingv1.ModelSource{S3: &servingv1.S3Source{Bucket: "models", Prefix: "llama/", Endpoint: "http://minio:9000"}}},
			Engine:   servingv1.EngineSpec{Type: servingv1.EngineVLLM},
			GPU:      servingv1.GPUSpec{Count: 1, Products: []string{"NVIDIA-L4"}},
			Replicas: ptr.To[int32](1),
		},
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(obj).WithStatusSubresource(&servingv1.AIInference{}).Build()
	r := &Reconciler{Client: c, APIReader: c, Scheme: scheme, Recorder: nopRecorder{}, Now: time.Now}

	var logs []string
	var logMu sync.Mutex
	logger := funcr.New(func(prefix, args string) {
		logMu.Lock()
		logs = append(logs, args)
		logMu.Unlock()
	}, funcr.Options{Verbosity: 1})
	if _, err := r.Reconcile(ctrl.LoggerInto(ctx, logger), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ml", Name: "llm"}}); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if err := shutdown(ctx); err != nil { // flushes the batch to the receiver
		t.Fatal(err)
	}

	spans := recv.Spans()
	var root *tracepb.Span
	byName := map[string]*tracepb.Span{}
	for _, s := range spans {
		byName[s.Name] = s
		if s.Name == "Reconcile" {
			root = s
		}
		t.Logf("span %-20s parent=%s %v", s.Name, hex.EncodeToString(s.ParentSpanId), attrs(s))
	}
	if root == nil {
		t.Fatalf("no Reconcile span among %d spans", len(spans))
	}
	if len(root.ParentSpanId) != 0 {
		t.Error("the Reconcile span has a parent")
	}
	if a := attrs(root); a["aiinference.namespace"] != "ml" || a["aiinference.name"] != "llm" || a["aiinference.generation"] != "1" {
		t.Errorf("Reconcile attributes: %v", a)
	}
	steps := []string{"checkReferences", "observe", "observeRouter", "reconcileConfigMap", "reconcileCachePVC", "reconcileDeployment", "reconcileService", "reconcileNetworkPolicies", "reconcileRouting", "reconcileTraffic", "replacePods", "patchStatus"}
	if len(spans) != len(steps)+1 {
		t.Errorf("got %d spans, want the reconcile and its %d steps", len(spans), len(steps))
	}
	for _, name := range steps {
		s := byName[name]
		if s == nil {
			t.Errorf("no %s span", name)
			continue
		}
		if string(s.TraceId) != string(root.TraceId) || string(s.ParentSpanId) != string(root.SpanId) {
			t.Errorf("%s is not a child of the Reconcile span", name)
		}
		if s.Status != nil && s.Status.Code == tracepb.Status_STATUS_CODE_ERROR {
			t.Errorf("%s failed: %s", name, s.Status.Message)
		}
	}
	for name, want := range map[string]string{"reconcileConfigMap": "ConfigMap/llm-loader", "reconcileDeployment": "Deployment/llm", "reconcileService": "Service/llm"} {
		if a := attrs(byName[name]); a["decision"] != "created" || a["child"] != want {
			t.Errorf("%s: decision %q child %q, want created %s", name, a["decision"], a["child"], want)
		}
	}
	if a := attrs(byName["patchStatus"]); a["decision"] != "written" || a["phase"] != "Pending" {
		t.Errorf("patchStatus attributes: %v", a)
	}
	traceID := hex.EncodeToString(root.TraceId)
	found := false
	for _, l := range logs {
		found = found || strings.Contains(l, `"traceID"="`+traceID+`"`)
	}
	if !found {
		t.Errorf("no log line carries the trace ID %s: %v", traceID, logs)
	}
}
