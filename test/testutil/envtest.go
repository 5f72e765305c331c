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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
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

// InstallCRDs creates the CRDs in the generated manifests at paths that the
// cluster lacks, and waits until the API server serves them and c's REST
// mapper maps their kinds: a CRD is Established before the discovery documents
// list it, and a Create through c in that gap fails with "no matches for kind".
func InstallCRDs(ctx context.Context, c client.Client, paths ...string) error {
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(data, crd); err != nil {
			return fmt.Errorf("reading the CRD of %s: %w", path, err)
		}
		if err := c.Create(ctx, crd); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating the CRD %s: %w", crd.Name, err)
		}
		crds = append(crds, crd)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, crd := range crds {
		for !crdServed(ctx, c, crd) {
			if time.Now().After(deadline) {
				return fmt.Errorf("the CRD %s is not established and discoverable after 30 s", crd.Name)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return nil
}

func crdServed(ctx context.Context, c client.Client, crd *apiextensionsv1.CustomResourceDefinition) bool {
	got := &apiextensionsv1.CustomResourceDefinition{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(crd), got); err != nil {
		return false
	}
	established := false
	for _, cond := range got.Status.Conditions {
		established = established || cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue
	}
	if !established {
		return false
	}
	kind := schema.GroupKind{Group: got.Spec.Group, Kind: got.Spec.Names.Kind}
	for _, v := range got.Spec.Versions {
		if v.Served {
			if _, err := c.RESTMapper().RESTMapping(kind, v.Name); err != nil {
				return false
			}
		}
	}
	return true
}
