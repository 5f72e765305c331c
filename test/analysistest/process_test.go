package analysistest

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/aiinference/operator/test/testutil/freeport"
)

// TestMain lets the test binary play a server that binds the port it is given
// on every interface, as llm-d-inference-sim does: `BINARY -serve-port PORT`.
func TestMain(m *testing.M) {
	if len(os.Args) == 3 && os.Args[1] == "-serve-port" {
		l, err := net.Listen("tcp4", ":"+os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		_ = http.Serve(l, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	}
	os.Exit(m.Run())
}

// A port found free and taken before the server binds it (issue 35:
// "llm-d-inference-sim-46373 exited while starting ... bind: address already
// in use") costs the server a start on another port, not the test.
func TestAServerWhosePortWasTakenStartsOnAnother(t *testing.T) {
	taken, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	pick := freeport.Pick
	t.Cleanup(func() { freeport.Pick = pick })
	picks := 0
	freeport.Pick = func() (int, error) {
		if picks++; picks == 1 {
			return taken.Addr().(*net.TCPAddr).Port, nil // found free, then taken
		}
		return pick()
	}
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	srv := launchServer(t, func(port string) string { return "server-" + port }, bin, func(port string) []string { return []string{"-serve-port", port} })
	srv.waitReady(t, "/", 10*time.Second)
	if picks != 2 || srv.addr == taken.Addr().String() {
		t.Fatalf("%d ports picked, serving on %s (the taken port: %s)", picks, srv.addr, taken.Addr())
	}
}
