package routerfaults

import (
	"fmt"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	code := m.Run()
	PrintTable(os.Stdout)
	cleanBuild()
	os.Exit(code)
}

// say prints a note of the harness (how the limit is set, a skip's reason)
// among the figures.
func say(format string, args ...any) {
	fmt.Printf("routerfaults: "+format+"\n", args...)
}
