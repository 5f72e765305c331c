package loader

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/aiinference/operator/internal/loadspec"
	"github.com/aiinference/operator/internal/ocipush"
	"github.com/aiinference/operator/test/ociregistry"
)

var (
	registryOnce sync.Once
	registryBin  string
	registryErr  error
)

// startRegistry runs the real registry with basic auth (user "puller").
func startRegistry(t *testing.T) *ociregistry.Registry {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the registry binary (hack/tools/build.sh registry)")
	}
	registryOnce.Do(func() { registryBin, registryErr = ociregistry.Binary() })
	if registryErr != nil {
		t.Fatalf("registry binary: %v", registryErr)
	}
	reg, err := ociregistry.Start(registryBin, t.TempDir(), ociregistry.Options{Username: "puller", Password: "s3same"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Stop)
	return reg
}

// pullSecrets writes the image pull Secrets a pod would have mounted: one for
// another registry, one for this one.
func pullSecrets(t *testing.T, host, user, password string) string {
	t.Helper()
	dir := t.TempDir()
	for name, h := range map[string]string{"other": "other.example:5000", "models": host} {
		auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		cfg := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, h, auth)
		if err := os.WriteFile(filepath.Join(dir, name, ".dockerconfigjson"), []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func ociOptions(source, dest, secrets string) Options {
	o := localOptions(source, dest)
	o.OCI = &loadspec.OCIOptions{PlainHTTP: true}
	o.PullSecretsDir = secrets
	return o
}

func TestOCISourceFromARealRegistry(t *testing.T) {
	reg := startRegistry(t)
	src, files := smallTree(t)
	push := ocipush.Options{PlainHTTP: true, Username: "puller", Password: "s3same"}
	ref := reg.Host + "/models/tiny:v1"
	digest, err := ocipush.Push(t.Context(), src, ref, push)
	if err != nil {
		t.Fatal(err)
	}
	secrets := pullSecrets(t, reg.Host, "puller", "s3same")

	dest := filepath.Join(t.TempDir(), "model")
	o := ociOptions("oci://"+ref, dest, secrets)
	s, err := runInProcess(t, o)
	if err != nil {
		t.Fatal(err)
	}
	sameAs(t, src, dest)
	// Every file is a layer, checked against its digest.
	if s.Resolved != digest || s.Checks[checkSHA256] != len(files)+1 || !s.Verified {
		t.Errorf("summary %+v: want resolved %s and every file checked by sha256", s, digest)
	}
	if s, err = runInProcess(t, o); err != nil || !s.CacheHit {
		t.Errorf("second run: %+v %v", s, err)
	}

	// By digest.
	byDigest := ociOptions("oci://"+reg.Host+"/models/tiny@"+digest, filepath.Join(t.TempDir(), "d"), secrets)
	if _, err := runInProcess(t, byDigest); err != nil {
		t.Fatal(err)
	}
	sameAs(t, src, byDigest.Dest)

	// The tag moves to another model: a loader pinned to the earlier digest
	// (resolved.json) loads that one.
	other, _ := smallTree(t)
	if err := os.WriteFile(filepath.Join(other, "config.json"), []byte(`{"other":true}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ocipush.Push(t.Context(), other, ref, push); err != nil {
		t.Fatal(err)
	}
	pinned := ociOptions("oci://"+ref, filepath.Join(t.TempDir(), "pinned"), secrets)
	pinned.Resolved = &loadspec.Resolved{Source: "oci://" + ref, Revision: digest}
	if s, err := runInProcess(t, pinned); err != nil || s.Resolved != digest {
		t.Fatalf("pinned: %+v %v", s, err)
	}
	sameAs(t, src, pinned.Dest)
}

func TestOCISourceFailures(t *testing.T) {
	reg := startRegistry(t)
	src, _ := smallTree(t)
	push := ocipush.Options{PlainHTTP: true, Username: "puller", Password: "s3same"}
	if _, err := ocipush.Push(t.Context(), src, reg.Host+"/models/tiny:v1", push); err != nil {
		t.Fatal(err)
	}
	push.Format = ocipush.Image
	if _, err := ocipush.Push(t.Context(), src, reg.Host+"/models/tiny:image", push); err != nil {
		t.Fatal(err)
	}
	secrets := pullSecrets(t, reg.Host, "puller", "s3same")
	for _, tc := range []struct {
		name, ref, secrets string
		reason, message    string
	}{
		{"no pull secret", "/models/tiny:v1", t.TempDir(), loadspec.ReasonAccessDenied, "imagePullSecrets"},
		{"wrong password", "/models/tiny:v1", pullSecrets(t, reg.Host, "puller", "nope"), loadspec.ReasonAccessDenied, "imagePullSecrets"},
		{"unknown tag", "/models/tiny:v9", secrets, loadspec.ReasonNotFound, "oci.reference"},
		{"unknown repository", "/models/nope:v1", secrets, loadspec.ReasonNotFound, "oci.reference"},
		{"an image in loader mode", "/models/tiny:image", secrets, loadspec.ReasonInvalidConfig, "ImageVolume"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runInProcess(t, ociOptions("oci://"+reg.Host+tc.ref, filepath.Join(t.TempDir(), "m"), tc.secrets))
			if reasonOf(err) != tc.reason || !strings.Contains(err.Error(), tc.message) {
				t.Fatalf("got %v, want %s saying %q", err, tc.reason, tc.message)
			}
			if loadspec.IsRetryableExit(int32(ExitCode(err))) {
				t.Errorf("exit %d is retryable", ExitCode(err))
			}
		})
	}
}
