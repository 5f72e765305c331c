package loadspec

import (
	"testing"
	"time"
)

func TestRetryDelayDoublesUpToTenMinutes(t *testing.T) {
	want := []time.Duration{30 * time.Second, time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute, 10 * time.Minute, 10 * time.Minute}
	for i, w := range want {
		n := i + 1
		if got := RetryDelay(30*time.Second, n); got != w {
			t.Errorf("RetryDelay(30s, %d) = %s, want %s", n, got, w)
		}
	}
}
