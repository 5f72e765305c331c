package routerfaults

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	code := m.Run()
	PrintTable(os.Stdout)
	cleanBuild()
	os.Exit(code)
}
