package localcluster_test

import (
	"context"
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/aiinference/operator/test/localcluster"
)

// An end-to-end test package starts one cluster in TestMain, runs the operator
// against Kubeconfig() or RESTConfig(), dumps LogsDir() on failure, and stops the
// cluster at the end.
func Example() {
	ctx := context.Background()
	cluster, err := localcluster.Start(ctx, localcluster.Options{Progress: os.Stderr})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cluster.Stop() //nolint:errcheck // example

	fmt.Println("KUBECONFIG =", cluster.Kubeconfig())
	fmt.Println("component logs in", cluster.LogsDir())

	// Later, a node with a GPU no pool had yet.
	names, err := cluster.AddNodes(ctx, localcluster.NodePool{
		Name: "b200", Count: 1, GPUProduct: "NVIDIA-B200", GPUCount: 8,
		CPU: resource.MustParse("224"), Memory: resource.MustParse("2Ti"),
	})
	fmt.Println(names, err)
}

// A pod (or the pod template of a Deployment) whose init container "loader"
// fails with exit code 20, again and again, in a crash loop.
func ExampleInitContainerFailure() {
	pod := &corev1.Pod{}
	localcluster.InitContainerFailure{Container: "loader", ExitCode: 20, Message: "access denied"}.Apply(pod)
	fmt.Println(pod.Labels[localcluster.InitContainerFailureLabel], pod.Annotations[localcluster.InitContainerFailureExitCodeAnnotation])
	// Output: true 20
}
