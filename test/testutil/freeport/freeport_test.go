package freeport

import (
	"errors"
	"fmt"
	"net"
	"testing"
)

func TestStartTriesAnotherPortOnlyWhenTheFirstWasTaken(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	held := taken.Addr().(*net.TCPAddr).Port
	pick := Pick
	t.Cleanup(func() { Pick = pick })
	picks := 0
	Pick = func() (int, error) {
		if picks++; picks == 1 {
			return held, nil
		}
		return pick()
	}
	listen := func(port int) error {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			l.Close()
		}
		return err
	}
	port, err := Start(listen)
	if err != nil || port == held || picks != 2 {
		t.Fatalf("Start: port %d (the taken one %d), %v, %d picks", port, held, err, picks)
	}

	picks = 1 // from here on Pick hands out free ports
	other := errors.New("no such binary")
	if _, err := Start(func(int) error { return other }); !errors.Is(err, other) || picks != 2 {
		t.Fatalf("another failure: %v after %d picks, want it at once", err, picks-1)
	}
	if _, err := Start(func(int) error { return fmt.Errorf("exited: %w", ErrTaken) }); !errors.Is(err, ErrTaken) || picks != 2+Attempts {
		t.Fatalf("always taken: %v after %d picks, want %d", err, picks-2, Attempts)
	}
}
