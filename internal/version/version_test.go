package version

import (
	"os"
	"regexp"
	"testing"
)

// TestManifestsNameThisVersion keeps the manifests on the version the binaries
// print, so `kubectl apply -k config/default` runs the images `make images` built.
func TestManifestsNameThisVersion(t *testing.T) {
	if !regexp.MustCompile(`^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`).MatchString(Version) {
		t.Fatalf("Version %q is not a semantic version with a v", Version)
	}
	manifest, err := os.ReadFile("../../config/manager/manager.yaml")
	if err != nil {
		t.Fatal(err)
	}
	images := regexp.MustCompile(`image:\s*(\S+)`).FindAllSubmatch(manifest, -1)
	if len(images) != 1 || string(images[0][1]) != OperatorImage() {
		t.Errorf("config/manager/manager.yaml names %q, want image %s", images, OperatorImage())
	}
	router, err := os.ReadFile("../../config/router/router.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if images := regexp.MustCompile(`image:\s*(\S+)`).FindAllSubmatch(router, -1); len(images) != 1 || string(images[0][1]) != RouterImage() {
		t.Errorf("config/router/router.yaml names %q, want image %s", images, RouterImage())
	}
	if LoaderImage() != "aiinference/model-loader:"+Version {
		t.Errorf("LoaderImage() = %s", LoaderImage())
	}
}
