package aiinference

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// A loader killed before it wrote its report still gets a message a person
// can act on: the status says what the kubelet saw, not an empty string.
func TestLoaderFailureWithoutReport(t *testing.T) {
	for _, tt := range []struct {
		name        string
		term        corev1.ContainerStateTerminated
		wantReason  string
		wantMessage string
	}{
		{"OOM kill", corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"},
			"OOMKilled", "the model loader was killed for exceeding its memory limit (exit code 137) and left no report"},
		{"crash", corev1.ContainerStateTerminated{ExitCode: 2, Reason: "Error"},
			"TransientError", "the model loader exited with code 2 and left no report"},
		{"the loader's own words", corev1.ContainerStateTerminated{ExitCode: 10, Reason: "Error", Message: "connection reset by peer"},
			"TransientError", "connection reset by peer"},
		{"its report", corev1.ContainerStateTerminated{ExitCode: 21, Reason: "Error",
			Message: `{"failure":{"reason":"SourceNotFound","message":"no objects under s3://models/x/","retryable":false}}`},
			"SourceNotFound", "no objects under s3://models/x/"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := loaderFailure(&tt.term)
			if got.Reason != tt.wantReason || got.Message != tt.wantMessage {
				t.Errorf("loaderFailure = %q: %q, want %q: %q", got.Reason, got.Message, tt.wantReason, tt.wantMessage)
			}
		})
	}
}
