package aiinference

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/engine"
	"github.com/aiinference/operator/internal/loadspec"
)

// resourceOf is the API resource of a child's kind (its lower-case plural).
func resourceOf(kind string) string {
	k := strings.ToLower(kind)
	if strings.HasSuffix(k, "y") {
		return strings.TrimSuffix(k, "y") + "ies"
	}
	return k + "s"
}

// TestChildrenTableListsEveryKindTheOperatorMakes: a kind the operator may
// create (config/rbac/role.yaml, from the RBAC markers) is a kind of the
// children table, and each of the table's kinds may be created, patched and
// deleted; every object the builders make is of a kind of the table, under a
// name the table gives that kind.
func TestChildrenTableListsEveryKindTheOperatorMakes(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(b, &role); err != nil {
		t.Fatal(err)
	}
	verbs := map[string][]string{}
	for _, rule := range role.Rules {
		for _, res := range rule.Resources {
			verbs[res] = append(verbs[res], rule.Verbs...)
		}
	}
	tableResources := map[string]bool{}
	for _, k := range childKinds() {
		res := resourceOf(k.kind)
		tableResources[res] = true
		for _, v := range []string{"create", "patch", "delete", "watch"} {
			if !slices.Contains(verbs[res], v) {
				t.Errorf("the children table lists %s, but the operator's role does not grant %s on %s", k.kind, v, res)
			}
		}
	}
	for res, vs := range verbs {
		if slices.Contains(vs, "create") && res != "events" && !tableResources[res] {
			t.Errorf("the operator may create %s, but no child of the children table is of that kind", res)
		}
	}

	obj := sampleInference()
	obj.Spec.Cache = &servingv1.CacheSpec{Type: servingv1.CachePVC, PVC: &servingv1.CachePVCSpec{Size: ptr.To(resource.MustParse("10Gi"))}}
	obj.Spec.NetworkPolicy = &servingv1.NetworkPolicySpec{}
	gw := &servingv1.GatewayTraffic{ParentRef: servingv1.GatewayRef{Name: "gw"}}
	eng, err := engine.For(obj.Spec.Engine.Type)
	if err != nil {
		t.Fatal(err)
	}
	config, err := desiredConfig(obj)
	if err != nil {
		t.Fatal(err)
	}
	cm, err := desiredConfigMap(obj, config, loadspec.Budget{})
	if err != nil {
		t.Fatal(err)
	}
	canaryCM, err := desiredCanaryConfigMap(obj, config, loadspec.Budget{})
	if err != nil {
		t.Fatal(err)
	}
	deployment := desiredDeployment(obj, eng, Options{}, hashOf(config))
	ingress, egress := desiredNetworkPolicies(obj, eng, "ops")
	built := []client.Object{
		cm, canaryCM, desiredCachePVC(obj), desiredService(obj, eng), ingress, egress,
		desiredActivatorSlice(obj, "10.0.0.1", 8080),
		desiredTrackService(obj, eng, obj.StableBackendName(), servingv1.TrackStable),
		desiredTrackService(obj, eng, obj.CanaryBackendName(), servingv1.TrackCanary),
		desiredInferencePool(obj, eng, obj.StableBackendName(), servingv1.TrackStable, servingv1.EndpointPicker{}),
		desiredInferencePool(obj, eng, obj.CanaryBackendName(), servingv1.TrackCanary, servingv1.EndpointPicker{}),
		desiredHTTPRoute(obj, eng, gw, 10),
		deployment, desiredCanaryDeployment(obj, deployment, 1),
	}
	for _, o := range built {
		kind := o.GetObjectKind().GroupVersionKind().Kind
		k := kindOf(kind)
		if k.names == nil {
			t.Errorf("a builder makes %s %s, a kind the children table lacks", kind, o.GetName())
			continue
		}
		if !slices.Contains(k.names(obj), o.GetName()) {
			t.Errorf("a builder names a %s %s, a name the children table does not give that kind (%v)", kind, o.GetName(), k.names(obj))
		}
	}
}
