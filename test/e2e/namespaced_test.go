package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/test/localcluster"
	"github.com/aiinference/operator/test/testutil"
)

// TestNamespaceModeWithRolesOnly runs the operator binary with
// --watch-namespaces as a ServiceAccount token that holds only
// config/namespaced's Role in the watched namespace and the leader election Role
// in its own: the local cluster's API server enforces it. An object in the
// watched namespace reaches Ready; one in another namespace is left alone. On
// the solo cluster: no other operator reconciles either namespace.
func TestNamespaceModeWithRolesOnly(t *testing.T) {
	e := soloCluster.own(t)
	g := NewWithT(t)
	ctx := context.Background()
	watched, elsewhere, home := e.newNamespace(t), e.newNamespace(t), e.newNamespace(t)
	root, err := testutil.RepoRoot()
	g.Expect(err).NotTo(HaveOccurred())

	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: home, Name: "aiinference-controller-manager"}}
	g.Expect(e.k8s.Create(ctx, sa)).To(Succeed())
	subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: home, Name: sa.Name}}
	raw, err := os.ReadFile(filepath.Join(root, "config", "namespaced", "role.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	docs := bytes.Split(raw, []byte("\n---\n"))
	var role rbacv1.Role
	var binding rbacv1.RoleBinding
	g.Expect(yaml.Unmarshal(docs[0], &role)).To(Succeed())
	g.Expect(yaml.Unmarshal(docs[1], &binding)).To(Succeed())
	role.Namespace, binding.Namespace, binding.Subjects = watched, watched, subjects
	g.Expect(e.k8s.Create(ctx, &role)).To(Succeed())
	g.Expect(e.k8s.Create(ctx, &binding)).To(Succeed())
	raw, err = os.ReadFile(filepath.Join(root, "config", "rbac", "leader_election_role.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	var le rbacv1.Role
	g.Expect(yaml.Unmarshal(raw, &le)).To(Succeed())
	le.Namespace = home
	g.Expect(e.k8s.Create(ctx, &le)).To(Succeed())
	g.Expect(e.k8s.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: home, Name: "leader-election"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: le.Name},
		Subjects:   subjects,
	})).To(Succeed())

	kubeconfig := e.tokenKubeconfig(t, g, home, sa.Name)

	scoped := e.operator("namespaced", kubeconfig, "--watch-namespaces="+watched, "--leader-election-namespace="+home)
	g.Expect(scoped.Start()).To(Succeed())
	defer scoped.Stop()

	inside := inference(watched, "scoped", 1, localcluster.GPUProductL4)
	outside := inference(elsewhere, "scoped", 1, localcluster.GPUProductL4)
	g.Expect(e.k8s.Create(ctx, inside)).To(Succeed())
	g.Expect(e.k8s.Create(ctx, outside)).To(Succeed())
	start := time.Now()
	e.waitFor(t, g, inside, readyTimeout, beReady(1))
	t.Logf("%s/%s Ready %.1f s after creation, reconciled by an operator whose token holds only Roles in %s and %s",
		watched, inside.Name, time.Since(start).Seconds(), watched, home)
	got := &servingv1.AIInference{}
	g.Expect(e.k8s.Get(ctx, client.ObjectKeyFromObject(outside), got)).To(Succeed())
	g.Expect(got.Status.Phase).To(BeEmpty(), "the object outside the watched namespace was reconciled")
	g.Expect(scoped.LogTail(200)).NotTo(ContainSubstring("forbidden"), "the operator hit a permission it lacks")
}

// tokenKubeconfig writes a kubeconfig for the cluster that holds a token of the
// ServiceAccount namespace/name and no other credential.
func (e *env) tokenKubeconfig(t *testing.T, g *WithT, namespace, name string) string {
	t.Helper()
	admin, err := clientcmd.BuildConfigFromFlags("", e.cluster.Kubeconfig())
	g.Expect(err).NotTo(HaveOccurred())
	tr, err := kubernetes.NewForConfigOrDie(admin).CoreV1().ServiceAccounts(namespace).CreateToken(context.Background(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(3600))}}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	ca := admin.CAData
	if len(ca) == 0 && admin.CAFile != "" {
		ca, err = os.ReadFile(admin.CAFile)
		g.Expect(err).NotTo(HaveOccurred())
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["local"] = &clientcmdapi.Cluster{Server: admin.Host, CertificateAuthorityData: ca}
	kc.AuthInfos["sa"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts["sa"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "sa"}
	kc.CurrentContext = "sa"
	kubeconfig := filepath.Join(t.TempDir(), name+".kubeconfig")
	g.Expect(clientcmd.WriteToFile(*kc, kubeconfig)).To(Succeed())
	return kubeconfig
}

func ptrTo[T any](v T) *T { return &v }
