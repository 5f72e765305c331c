package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"slices"
	"testing"
)

// The engine image's stand-ins are links to fake-vllm, /bin/bash in a
// folder of its own.
func TestRootFSWritesLinksAndTheirFolders(t *testing.T) {
	layer, err := rootFS([]file{{path: "fake-vllm", data: []byte("binary")}},
		[]link{{name: "/bin/bash", target: "/fake-vllm"}, {name: "/bash", target: "/fake-vllm"}, {name: "/bin/sh", target: "/fake-vllm"}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		entry := h.Name
		switch h.Typeflag {
		case tar.TypeSymlink:
			entry += " -> " + h.Linkname
		case tar.TypeDir:
			entry += " (folder)"
		}
		got = append(got, entry)
	}
	want := []string{"tmp/ (folder)", "fake-vllm", "bin/ (folder)", "bin/bash -> /fake-vllm", "bash -> /fake-vllm", "bin/sh -> /fake-vllm"}
	if !slices.Equal(got, want) {
		t.Errorf("layer entries %q, want %q", got, want)
	}
}
