package testutil

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// StartEnvtest starts a real kube-apiserver and etcd for one test, with the
// project's CRDs installed when withCRDs, and stops them when the test ends. It
// returns the admin configuration and the repository root.
func StartEnvtest(t testing.TB, withCRDs bool) (*rest.Config, string) {
	t.Helper()
	env, root, err := environment(withCRDs)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := StartEnvironment(env)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	return cfg, root
}

// StartSuiteEnvtest starts a real kube-apiserver and etcd for a suite's
// TestMain, with the project's CRDs and those of the manifests in extraCRDs
// installed; the suite stops it with env.Stop.
func StartSuiteEnvtest(extraCRDs ...string) (*envtest.Environment, *rest.Config, error) {
	env, _, err := environment(true, extraCRDs...)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := StartEnvironment(env)
	if err != nil {
		return nil, nil, fmt.Errorf("starting envtest: %w", err)
	}
	return env, cfg, nil
}

// environment is an envtest environment on the project's binaries, installing
// the project's CRDs and extraCRDs when withCRDs, and the repository root.
func environment(withCRDs bool, extraCRDs ...string) (*envtest.Environment, string, error) {
	assets, err := EnvtestAssets()
	if err != nil {
		return nil, "", fmt.Errorf("envtest binaries: %w", err)
	}
	root, err := RepoRoot()
	if err != nil {
		return nil, "", err
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets}
	if withCRDs {
		env.CRDDirectoryPaths = append([]string{filepath.Join(root, "config", "crd", "bases")}, extraCRDs...)
		env.ErrorIfCRDPathMissing = true
	}
	return env, root, nil
}

// NewClient is a client of the API server at cfg for a test, with scheme.
func NewClient(t testing.TB, cfg *rest.Config, scheme *runtime.Scheme) client.Client {
	t.Helper()
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// StartEnvironment starts env as env.Start does, and starts it again (twice at
// most) when its API server is up but the default namespace has not appeared
// within the 5 s that envtest allows: on two cores busy with the rest of make
// test, the API server's bootstrap has taken longer (seen failing a run).
func StartEnvironment(env *envtest.Environment) (*rest.Config, error) {
	pristine := *env
	for attempt := 1; ; attempt++ {
		cfg, err := env.Start()
		if err == nil || attempt == 3 || !strings.Contains(err.Error(), "default namespace didn't register") {
			return cfg, err
		}
		fmt.Fprintf(os.Stderr, "envtest, attempt %d: %v; starting a new control plane\n", attempt, err)
		_ = env.Stop()
		*env = pristine
	}
}

// InstallCRD creates the CRD in the generated manifest at path and waits until
// the API server serves it.
func InstallCRD(ctx context.Context, c client.Client, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.Unmarshal(data, crd); err != nil {
		return err
	}
	if err := c.Create(ctx, crd); err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		got := &apiextensionsv1.CustomResourceDefinition{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(crd), got); err == nil {
			for _, cond := range got.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return nil
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("CRD %s not established after 30s", crd.Name)
}
