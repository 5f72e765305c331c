package manager

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/test/testutil"
)

// TestNamespaceMode runs the operator with --watch-namespaces=team-a as a
// ServiceAccount that holds only config/namespaced's Role in team-a and the
// leader election Role in its own namespace, against a real kube-apiserver that
// enforces RBAC: the operator starts, reconciles an AIInference in team-a
// (writing the children and the status; it may not read the credentials Secret,
// which only the kubelet reads), and leaves one in team-b alone, where it may
// not even read.
func TestNamespaceMode(t *testing.T) {
	cfg, root := testutil.StartEnvtest(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs := kubernetes.NewForConfigOrDie(cfg)
	admin := testutil.NewClient(t, cfg, Scheme())
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range []string{"aiinference-system", "team-a", "team-b"} {
		must(admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	}
	must(admin.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "aiinference-system", Name: "aiinference-controller-manager"}}))

	// The shipped Role and RoleBinding, in team-a only.
	raw, err := os.ReadFile(filepath.Join(root, "config", "namespaced", "role.yaml"))
	must(err)
	docs := bytes.Split(raw, []byte("\n---\n"))
	var role rbacv1.Role
	var binding rbacv1.RoleBinding
	must(yaml.Unmarshal(docs[0], &role))
	must(yaml.Unmarshal(docs[1], &binding))
	role.Namespace, binding.Namespace = "team-a", "team-a"
	must(admin.Create(ctx, &role))
	must(admin.Create(ctx, &binding))
	// The leader election Role of config/rbac, in the operator's namespace.
	raw, err = os.ReadFile(filepath.Join(root, "config", "rbac", "leader_election_role.yaml"))
	must(err)
	var le rbacv1.Role
	must(yaml.Unmarshal(raw, &le))
	le.Namespace = "aiinference-system"
	must(admin.Create(ctx, &le))
	must(admin.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: "aiinference-system", Name: "leader-election"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: le.Name},
		Subjects:   binding.Subjects,
	}))

	tr, err := cs.CoreV1().ServiceAccounts("aiinference-system").CreateToken(ctx, "aiinference-controller-manager", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	must(err)
	saCfg := &rest.Config{Host: cfg.Host, BearerToken: tr.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAData: cfg.CAData}}
	// The token really is that narrow: it may not list Deployments cluster-wide.
	if _, err := kubernetes.NewForConfigOrDie(saCfg).AppsV1().Deployments("").List(ctx, metav1.ListOptions{}); err == nil {
		t.Fatal("the operator's token lists Deployments in every namespace; the test would prove nothing")
	}
	// Nor may it read a Secret in the namespace it serves.
	for _, verb := range []string{"get", "list", "watch"} {
		review, err := kubernetes.NewForConfigOrDie(saCfg).AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: "team-a", Verb: verb, Resource: "secrets"}},
		}, metav1.CreateOptions{})
		must(err)
		if review.Status.Allowed {
			t.Errorf("config/namespaced's Role lets the operator %s Secrets in team-a", verb)
		}
	}

	mgr, err := New(saCfg, Options{
		WatchNamespaces: []string{"team-a"}, LeaderElection: true, LeaderElectionNamespace: "aiinference-system",
		MetricsBindAddress: "0", HealthProbeBindAddress: "0", LoaderImage: "example.test/model-loader:test", skipNameValidation: true,
	})
	must(err)
	mgrCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mgrCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})

	for _, ns := range []string{"team-a", "team-b"} {
		must(admin.Create(ctx, testutil.S3Secret(ns, testutil.S3SecretName)))
		must(admin.Create(ctx, namespacedInference(ns)))
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var obj servingv1.AIInference
		must(admin.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: "chat"}, &obj))
		depErr := admin.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: "chat"}, &appsv1.Deployment{})
		if depErr == nil && obj.Status.Phase != "" && obj.Status.ObservedGeneration == obj.Generation {
			t.Logf("team-a/chat: phase %s, Deployment made, as a ServiceAccount with Roles only", obj.Status.Phase)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("team-a/chat not reconciled: status %+v, Deployment: %v", obj.Status, depErr)
		}
		time.Sleep(250 * time.Millisecond)
	}
	var other servingv1.AIInference
	must(admin.Get(ctx, client.ObjectKey{Namespace: "team-b", Name: "chat"}, &other))
	if other.Status.Phase != "" {
		t.Errorf("team-b/chat, outside the watched namespaces, has a status: %+v", other.Status)
	}
}

func namespacedInference(ns string) *servingv1.AIInference {
	return testutil.Inference(ns, "chat", 1, "NVIDIA-L4")
}
