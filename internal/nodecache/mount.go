package nodecache

import (
	"errors"
	"io/fs"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// BindMounter bind-mounts with the kernel (the plugin runs privileged, in the
// mount namespace the kubelet sees).
type BindMounter struct{}

func (BindMounter) Bind(source, target string) error {
	return unix.Mount(source, target, "", unix.MS_BIND, "")
}

func (BindMounter) Unmount(target string) error {
	err := unix.Unmount(target, 0)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, fs.ErrNotExist) {
		return nil // not a mount point (any more)
	}
	return err
}

// IsMounted tells whether target is a mount point; a missing target is not.
func (BindMounter) IsMounted(target string) (bool, error) {
	ok, err := mountinfo.Mounted(target)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return ok, err
}
