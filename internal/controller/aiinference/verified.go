package aiinference

import (
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// podSpecDropped tells whether a Deployment came from the cache, which keeps no
// pod spec (internal/manager's stripForCache: the pod templates were a quarter
// of the operator's live heap at 1000 objects). A Deployment the API server
// returns always has a container.
func podSpecDropped(d *appsv1.Deployment) bool {
	return len(d.Spec.Template.Spec.Containers) == 0
}

// verifiedGenerations remembers, per Deployment, the generation whose spec the
// operator last wrote or compared in full with the desired one. A Deployment's
// generation changes with every write of its spec, by anyone: while the cached
// one has the generation remembered and the desired spec's hash, nobody edited
// it, and the pod spec the cache lacks need not be read. After a restart each
// Deployment is read once.
type verifiedGenerations struct{ m sync.Map }

type verifiedGeneration struct {
	uid        types.UID
	generation int64
}

func (v *verifiedGenerations) matches(d *appsv1.Deployment) bool {
	got, ok := v.m.Load(types.NamespacedName{Namespace: d.Namespace, Name: d.Name})
	return ok && got.(verifiedGeneration) == verifiedGeneration{uid: d.UID, generation: d.Generation}
}

func (v *verifiedGenerations) record(key types.NamespacedName, uid types.UID, generation int64) {
	v.m.Store(key, verifiedGeneration{uid: uid, generation: generation})
}

// forget drops the Deployments of an AIInference that is gone.
func (v *verifiedGenerations) forget(inference types.NamespacedName) {
	obj := &servingv1.AIInference{ObjectMeta: metav1.ObjectMeta{Namespace: inference.Namespace, Name: inference.Name}}
	for _, name := range []string{obj.Name, obj.CanaryName()} {
		v.m.Delete(types.NamespacedName{Namespace: obj.Namespace, Name: name})
	}
}
