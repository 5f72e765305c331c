package router

import (
	"context"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/test/testutil"
)

// KubeDirectory against a real API server: a Host leads to the model of the
// Service it names (a bare name in the client's own namespace only), to a
// track for a -canary Service, and to nothing else; only serving pods are
// endpoints, at the engine's "http" port.
func TestKubeDirectory(t *testing.T) {
	cfg, _ := testutil.StartEnvtest(t, true)
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(servingv1.AddToScheme(scheme))
	c := testutil.NewClient(t, cfg, scheme)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	for _, ns := range []string{"team-a", "team-b"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	model := testutil.Inference("team-b", "chat", 1)
	if err := c.Create(ctx, model); err != nil {
		t.Fatal(err)
	}
	service := func(name string, labels, selector map[string]string) *corev1.Service {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: name, Labels: labels},
			Spec: corev1.ServiceSpec{Selector: selector, Ports: []corev1.ServicePort{{Name: "http", Port: 8000}}}}
		if err := c.Create(ctx, svc); err != nil {
			t.Fatal(err)
		}
		return svc
	}
	main := service("chat", map[string]string{servingv1.LabelInference: "chat", servingv1.LabelTrack: servingv1.TrackStable}, nil)
	service("chat-canary", map[string]string{servingv1.LabelInference: "chat"}, map[string]string{servingv1.LabelInference: "chat", servingv1.LabelTrack: servingv1.TrackCanary})
	service("openai", map[string]string{LabelOpenAIAddress: "true"}, nil)
	service("unrelated", nil, nil)

	pod := func(ns, name, ip string, labels map[string]string, serving bool) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: servingv1.EngineContainerName, Image: "engine",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8000}}}}}}
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			ContainerStatuses: []corev1.ContainerStatus{{Name: servingv1.EngineContainerName, Ready: serving}}}
		if err := c.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	pod("team-a", "client", "10.1.0.5", nil, true)
	pod("team-b", "neighbour", "10.1.0.6", nil, true)
	pod("team-b", "chat-1", "10.2.0.1", map[string]string{servingv1.LabelInference: "chat", servingv1.LabelTrack: servingv1.TrackStable}, true)
	pod("team-b", "chat-2", "10.2.0.2", map[string]string{servingv1.LabelInference: "chat", servingv1.LabelTrack: servingv1.TrackStable}, false)
	pod("team-b", "chat-canary-1", "10.2.0.3", map[string]string{servingv1.LabelInference: "chat", servingv1.LabelTrack: servingv1.TrackCanary}, true)

	objects, err := cache.New(cfg, cache.Options{Scheme: scheme, ByObject: map[client.Object]cache.ByObject{&corev1.Pod{}: {Transform: TrimPod}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := IndexFields(ctx, objects); err != nil {
		t.Fatal(err)
	}
	go func() { _ = objects.Start(ctx) }()
	dir := KubeDirectory{Reader: objects}
	fromA, fromB := netip.MustParseAddr("10.1.0.5"), netip.MustParseAddr("10.1.0.6")
	// Wait for the cache to hold the pods' status.
	deadline := time.Now().Add(20 * time.Second)
	for dir.namespaceOf(ctx, fromA) == "" {
		if time.Now().After(deadline) {
			t.Fatal("the cache did not see the client pod")
		}
		time.Sleep(50 * time.Millisecond)
	}

	for _, tc := range []struct {
		host   string
		client netip.Addr
		want   Target
		ok     bool
	}{
		{"chat.team-b", fromA, Target{Namespace: "team-b", Model: "chat"}, true},
		{"chat.team-b.svc.cluster.local:8000", fromA, Target{Namespace: "team-b", Model: "chat"}, true},
		{"chat", fromB, Target{Namespace: "team-b", Model: "chat"}, true},
		{"chat", fromA, Target{}, false}, // no chat in team-a, the client's namespace
		{"chat", netip.MustParseAddr("192.0.2.1"), Target{}, false},
		{main.Spec.ClusterIP + ":8000", fromA, Target{Namespace: "team-b", Model: "chat"}, true},
		{"chat-canary.team-b", fromA, Target{Namespace: "team-b", Model: "chat", Track: servingv1.TrackCanary}, true},
		{"openai.team-b", fromA, Target{Namespace: "team-b"}, true},
		{"unrelated.team-b", fromA, Target{}, false},
		{"kubernetes.default", fromA, Target{}, false},
	} {
		got, ok := dir.Target(ctx, tc.host, tc.client)
		if ok != tc.ok || got != tc.want {
			t.Errorf("Target(%q from %s) = %+v %v, want %+v %v", tc.host, tc.client, got, ok, tc.want, tc.ok)
		}
	}

	obj, err := dir.Model(ctx, types.NamespacedName{Namespace: "team-b", Name: "chat"})
	if err != nil || obj == nil {
		t.Fatalf("Model: %v %v", obj, err)
	}
	eps, err := dir.Endpoints(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Endpoint{}
	for _, e := range eps {
		got[e.Name] = e
	}
	if len(got) != 2 || got["chat-1"].Addr != "10.2.0.1:8000" || got["chat-canary-1"].Track != servingv1.TrackCanary ||
		got["chat-1"].MetricsURL != "http://10.2.0.1:8000/metrics" {
		t.Errorf("endpoints %+v, want chat-1 and chat-canary-1 (chat-2 is not ready)", eps)
	}
}
