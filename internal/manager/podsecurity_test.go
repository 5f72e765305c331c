package manager

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/aiinference/operator/test/testutil"
)

// TestOperatorPodIsRestricted submits the operator's own pod, from
// config/manager/manager.yaml's Deployment, to a real kube-apiserver's Pod
// Security admission in the namespace that manifest ships (labelled
// pod-security.kubernetes.io/enforce: restricted): it is admitted. The same pod
// without its security contexts is refused, so the check is live.
func TestOperatorPodIsRestricted(t *testing.T) {
	cfg, root := testutil.StartEnvtest(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := testutil.NewClient(t, cfg, Scheme())
	raw, err := os.ReadFile(filepath.Join(root, "config", "manager", "manager.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs := bytes.Split(raw, []byte("\n---\n"))
	var ns corev1.Namespace
	var dep appsv1.Deployment
	if err := yaml.Unmarshal(docs[0], &ns); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(docs[1], &dep); err != nil {
		t.Fatal(err)
	}
	if ns.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Fatalf("the operator's namespace does not enforce restricted: %v", ns.Labels)
	}
	if err := c.Create(ctx, &ns); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: dep.Spec.Template.Spec.ServiceAccountName}}); err != nil {
		t.Fatal(err)
	}
	pod := func(name string, spec corev1.PodSpec) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: name, Labels: dep.Spec.Template.Labels}, Spec: spec}
	}
	if err := c.Create(ctx, pod("operator", dep.Spec.Template.Spec)); err != nil {
		t.Fatalf("the operator's pod is refused in a restricted namespace: %v", err)
	}
	loose := *dep.Spec.Template.Spec.DeepCopy()
	loose.SecurityContext = nil
	loose.Containers[0].SecurityContext = nil
	err = c.Create(ctx, pod("loose", loose))
	if err == nil || !strings.Contains(err.Error(), "violates PodSecurity \"restricted") {
		t.Fatalf("a pod without security contexts was not refused by Pod Security admission: %v", err)
	}
	t.Logf("Admitted: the operator's pod; refused, as a control: %v", err)
}
