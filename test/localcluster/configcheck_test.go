package localcluster

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestConfigErrorIsTheKubelets(t *testing.T) {
	secrets := map[string]*corev1.Secret{"creds": {Data: map[string][]byte{"AWS_ACCESS_KEY_ID": []byte("a")}}}
	configMaps := map[string]*corev1.ConfigMap{"settings": {Data: map[string]string{"level": "info"}}}
	secret := func(name string) (*corev1.Secret, bool) { s, ok := secrets[name]; return s, ok }
	configMap := func(name string) (*corev1.ConfigMap, bool) { m, ok := configMaps[name]; return m, ok }
	secretKey := func(name, key string, optional bool) corev1.EnvVar {
		return corev1.EnvVar{Name: key, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key, Optional: ptr.To(optional)}}}
	}
	for _, tc := range []struct {
		name          string
		init, main    []corev1.Container
		wantContainer string
		wantMessage   string
	}{
		{name: "all there", init: []corev1.Container{{Name: "model-loader", Env: []corev1.EnvVar{secretKey("creds", "AWS_ACCESS_KEY_ID", false)}}},
			main: []corev1.Container{{Name: "engine", EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}}}}},
		{name: "missing Secret", init: []corev1.Container{{Name: "model-loader", Env: []corev1.EnvVar{secretKey("store-credentials", "AWS_ACCESS_KEY_ID", false)}}},
			wantContainer: "model-loader", wantMessage: `secret "store-credentials" not found`},
		{name: "missing key", init: []corev1.Container{{Name: "model-loader", Env: []corev1.EnvVar{secretKey("creds", "AWS_SECRET_ACCESS_KEY", false)}}},
			wantContainer: "model-loader", wantMessage: "couldn't find key AWS_SECRET_ACCESS_KEY in Secret team-a/creds"},
		{name: "optional", init: []corev1.Container{{Name: "model-loader", Env: []corev1.EnvVar{secretKey("nothing", "K", true), secretKey("creds", "NOPE", true)}}}},
		{name: "envFrom before env, init containers first",
			init: []corev1.Container{{Name: "first"}, {Name: "second", Env: []corev1.EnvVar{secretKey("nothing", "K", false)},
				EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "other"}}}}}},
			main:          []corev1.Container{{Name: "engine", Env: []corev1.EnvVar{secretKey("gone", "K", false)}}},
			wantContainer: "second", wantMessage: `secret "other" not found`},
		{name: "engine's ConfigMap key", main: []corev1.Container{{Name: "engine", Env: []corev1.EnvVar{{Name: "L", ValueFrom: &corev1.EnvVarSource{
			ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}, Key: "debug"}}}}}},
			wantContainer: "engine", wantMessage: "couldn't find key debug in ConfigMap team-a/settings"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "p"}, Spec: corev1.PodSpec{InitContainers: tc.init, Containers: tc.main}}
			container, msg := configError(pod, secret, configMap)
			if container != tc.wantContainer || msg != tc.wantMessage {
				t.Errorf("got %q %q, want %q %q", container, msg, tc.wantContainer, tc.wantMessage)
			}
		})
	}
}

// A kubelet does not start a container whose Secret or key is missing: the
// container waits with CreateContainerConfigError, the pod is never Ready, and
// it starts once the Secret has the key. The simulated kubelets do the same.
func TestAMissingSecretStopsThePodAsAKubeletDoes(t *testing.T) {
	ctx, client := needCluster(t)
	ns := testNamespace(ctx, t, client)
	spec := gpuPodSpec(1, GPUProductL4)
	spec.InitContainers[0].Env = []corev1.EnvVar{
		{Name: "AWS_ACCESS_KEY_ID", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "store-credentials"}, Key: "AWS_ACCESS_KEY_ID"}}},
		{Name: "AWS_SECRET_ACCESS_KEY", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "store-credentials"}, Key: "AWS_SECRET_ACCESS_KEY"}}},
	}
	createDeployment(ctx, t, client, ns, "model", spec, func(metav1.Object) {})

	waitConfigError := func(want string) {
		t.Helper()
		watchPods(ctx, t, client, ns, "model", func(pod *corev1.Pod) (bool, error) {
			if pod.Status.Phase != corev1.PodPending {
				return false, fmt.Errorf("pod %s is %s, want Pending: %+v", pod.Name, pod.Status.Phase, pod.Status)
			}
			if s, _ := containerStatus(pod.Status.ContainerStatuses, "server"); s.State.Running != nil {
				return false, fmt.Errorf("the server runs: %+v", s)
			}
			s, _ := containerStatus(pod.Status.InitContainerStatuses, "loader")
			if s.State.Running != nil || s.State.Terminated != nil {
				return false, fmt.Errorf("the loader started: %+v", s)
			}
			return s.State.Waiting != nil && s.State.Waiting.Reason == "CreateContainerConfigError" && s.State.Waiting.Message == want, nil
		})
	}
	waitConfigError(`secret "store-credentials" not found`)

	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "store-credentials"}, StringData: map[string]string{"AWS_ACCESS_KEY_ID": "a"}}
	if _, err := client.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitConfigError("couldn't find key AWS_SECRET_ACCESS_KEY in Secret " + ns + "/store-credentials")

	secret.StringData["AWS_SECRET_ACCESS_KEY"] = "s"
	if _, err := client.CoreV1().Secrets(ns).Update(ctx, secret, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "the Deployment to be available once the Secret has both keys", func() (bool, string) {
		d, err := client.AppsV1().Deployments(ns).Get(ctx, "model", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return d.Status.AvailableReplicas == 1, fmt.Sprintf("%+v", d.Status)
	})
}
