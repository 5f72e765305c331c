package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// A kubelet builds a container's environment before it starts the container.
// A Secret or ConfigMap, or a key of one, that a reference names without
// optional: true but that does not exist stops it: the container waits with
// CreateContainerConfigError and the kubelet's error as its message (the
// operator reads it there: SecretNotFound, SecretKeyMissing), and the kubelet
// tries again until the object is there. kwok's Stages see the pod alone, so
// the cluster looks at the objects for them: checkConfig annotates each pod of
// a simulated node once it is scheduled (again when a Secret or ConfigMap of
// its namespace changes, while it has an error), kwok's stages that start
// containers wait for the annotation, and a Stage of ours shows the error.
const (
	// ConfigCheckedAnnotation is "true" once the pod's references were looked at.
	ConfigCheckedAnnotation = "localcluster.aiinference.io/config-checked"
	// ConfigErrorAnnotation is the kubelet's error for the first container
	// (init containers first, in order) whose environment cannot be built.
	ConfigErrorAnnotation = "localcluster.aiinference.io/config-error"
	// ConfigErrorContainerAnnotation names that container.
	ConfigErrorContainerAnnotation = ConfigErrorAnnotation + "-container"
)

// configError is the first container of pod, init containers first, whose
// environment the kubelet cannot build, with the kubelet's error
// (makeEnvironmentVariables: envFrom first, then env); "" when there is none.
// secret and configMap look an object of the pod's namespace up.
func configError(pod *corev1.Pod, secret func(name string) (*corev1.Secret, bool), configMap func(name string) (*corev1.ConfigMap, bool)) (container, msg string) {
	optional := func(o *bool) bool { return o != nil && *o }
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		for _, from := range c.EnvFrom {
			if ref := from.SecretRef; ref != nil && !optional(ref.Optional) {
				if _, ok := secret(ref.Name); !ok {
					return c.Name, fmt.Sprintf("secret %q not found", ref.Name)
				}
			}
			if ref := from.ConfigMapRef; ref != nil && !optional(ref.Optional) {
				if _, ok := configMap(ref.Name); !ok {
					return c.Name, fmt.Sprintf("configmap %q not found", ref.Name)
				}
			}
		}
		for _, env := range c.Env {
			if env.ValueFrom == nil {
				continue
			}
			if ref := env.ValueFrom.SecretKeyRef; ref != nil && !optional(ref.Optional) {
				s, ok := secret(ref.Name)
				if !ok {
					return c.Name, fmt.Sprintf("secret %q not found", ref.Name)
				}
				if _, ok := s.Data[ref.Key]; !ok {
					if _, ok := s.StringData[ref.Key]; !ok {
						return c.Name, fmt.Sprintf("couldn't find key %s in Secret %s/%s", ref.Key, pod.Namespace, ref.Name)
					}
				}
			}
			if ref := env.ValueFrom.ConfigMapKeyRef; ref != nil && !optional(ref.Optional) {
				m, ok := configMap(ref.Name)
				if !ok {
					return c.Name, fmt.Sprintf("configmap %q not found", ref.Name)
				}
				_, inData := m.Data[ref.Key]
				_, inBinary := m.BinaryData[ref.Key]
				if !inData && !inBinary {
					return c.Name, fmt.Sprintf("couldn't find key %s in ConfigMap %s/%s", ref.Key, pod.Namespace, ref.Name)
				}
			}
		}
	}
	return "", ""
}

// startConfigCheck runs checkConfig until ctx ends.
func (c *Cluster) startConfigCheck(ctx context.Context) error {
	factory := informers.NewSharedInformerFactory(c.client, 0)
	core := factory.Core().V1()
	pods, secrets, configMaps, nodes := core.Pods(), core.Secrets(), core.ConfigMaps(), core.Nodes()
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[types.NamespacedName]())
	go func() { <-ctx.Done(); queue.ShutDown() }()

	addPod := func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok {
			queue.Add(types.NamespacedName{Namespace: p.Namespace, Name: p.Name})
		}
	}
	if _, err := pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: addPod, UpdateFunc: func(_, obj any) { addPod(obj) },
	}); err != nil {
		return err
	}
	// A Secret or ConfigMap that changes may unblock the pods of its namespace.
	recheckNamespace := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		o, ok := obj.(interface{ GetNamespace() string })
		if !ok {
			return
		}
		blocked, _ := pods.Lister().Pods(o.GetNamespace()).List(labels.Everything())
		for _, p := range blocked {
			if p.Annotations[ConfigErrorAnnotation] != "" {
				addPod(p)
			}
		}
	}
	for _, inf := range []cache.SharedIndexInformer{secrets.Informer(), configMaps.Informer()} {
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: recheckNamespace, UpdateFunc: func(_, obj any) { recheckNamespace(obj) }, DeleteFunc: recheckNamespace,
		}); err != nil {
			return err
		}
	}
	nodes.Informer() // registered before Start
	factory.Start(ctx.Done())
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("the config check's %v cache did not sync", typ)
		}
	}

	check := func(key types.NamespacedName) error {
		pod, err := pods.Lister().Pods(key.Namespace).Get(key.Name)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil || pod.DeletionTimestamp != nil || pod.Spec.NodeName == "" {
			return err
		}
		if pod.Annotations[ConfigCheckedAnnotation] == "true" && pod.Annotations[ConfigErrorAnnotation] == "" {
			return nil // started: the kubelet looks no more
		}
		node, err := nodes.Lister().Get(pod.Spec.NodeName)
		if err != nil || node.Annotations[KwokNodeAnnotation] != "fake" {
			return nil // a real kubelet's pod, or a node gone
		}
		container, msg := configError(pod,
			func(name string) (*corev1.Secret, bool) {
				s, err := secrets.Lister().Secrets(pod.Namespace).Get(name)
				return s, err == nil
			},
			func(name string) (*corev1.ConfigMap, bool) {
				m, err := configMaps.Lister().ConfigMaps(pod.Namespace).Get(name)
				return m, err == nil
			})
		if pod.Annotations[ConfigCheckedAnnotation] == "true" && pod.Annotations[ConfigErrorAnnotation] == msg &&
			pod.Annotations[ConfigErrorContainerAnnotation] == container {
			return nil
		}
		annotations := map[string]any{ConfigCheckedAnnotation: "true", ConfigErrorAnnotation: nil, ConfigErrorContainerAnnotation: nil}
		if msg != "" {
			annotations[ConfigErrorAnnotation], annotations[ConfigErrorContainerAnnotation] = msg, container
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
		if err != nil {
			return err
		}
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err = c.client.CoreV1().Pods(pod.Namespace).Patch(pctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	go func() {
		for {
			key, shutdown := queue.Get()
			if shutdown {
				return
			}
			if err := check(key); err != nil && ctx.Err() == nil {
				queue.AddRateLimited(key)
			} else {
				queue.Forget(key)
			}
			queue.Done(key)
		}
	}()
	return nil
}
