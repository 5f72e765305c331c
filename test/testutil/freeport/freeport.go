// Package freeport gives the servers tests start a loopback port without a
// race. A port found free (listen on :0, close) can be taken before the server
// binds it: by another test's server, or as the source port of an outgoing
// connection, which the kernel takes from the same range. A server that binds
// its port itself is therefore started again on another port when it fails
// because its port was taken (Start); an in-process server is better handed
// the listener it will serve.
package freeport

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
)

// Attempts bounds how many ports Start tries.
const Attempts = 5

// Pick is a loopback TCP port nobody listens on right now. Tests may replace
// it to hand out a port they hold (to see a clash handled).
var Pick = func() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ErrTaken marks a server's start that failed because its port was taken.
var ErrTaken = errors.New("port taken before the server bound it")

// Taken tells whether err or a server's output says its port was taken
// ("bind: address already in use", as Go and most servers put it).
func Taken(err error, output string) bool {
	return errors.Is(err, ErrTaken) || errors.Is(err, syscall.EADDRINUSE) ||
		strings.Contains(output, "address already in use") || err != nil && strings.Contains(err.Error(), "address already in use")
}

// Start calls start with a free port until it succeeds, fails for another
// reason than a taken port (see Taken), or Attempts ports were taken. It
// returns the port start succeeded with.
func Start(start func(port int) error) (int, error) {
	var err error
	for range Attempts {
		var port int
		if port, err = Pick(); err != nil {
			return 0, err
		}
		if err = start(port); err == nil || !Taken(err, "") {
			return port, err
		}
	}
	return 0, fmt.Errorf("%d ports taken before the server bound them, the last: %w", Attempts, err)
}
