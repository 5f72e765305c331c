package kubectlaii

import (
	"testing"

	"github.com/aiinference/operator/internal/loadspec"
)

func TestDescribeProgress(t *testing.T) {
	p := &loadspec.Progress{Stage: "downloading", Bytes: 3_200_000_000, Total: 16_000_000_000, RateBytesPerSecond: 410e6, ETASeconds: 31, Files: 12, FilesDone: 3}
	if got, want := describeProgress(p), "loading 3.2 GB of 16.0 GB (20%), 410.0 MB/s, ETA 31s, 3/12 files"; got != want {
		t.Errorf("describeProgress = %q, want %q", got, want)
	}
}
