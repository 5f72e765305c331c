package testutil

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

// RequiredVersion is the version of module that the go.mod at gomod requires:
// the version a tools module pins for a binary the tests build.
func RequiredVersion(gomod, module string) (string, error) {
	f, err := os.Open(gomod)
	if err != nil {
		return "", err
	}
	defer f.Close()
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		fields := strings.Fields(strings.TrimPrefix(strings.TrimSpace(scanner.Text()), "require "))
		if len(fields) >= 2 && fields[0] == module && strings.HasPrefix(fields[1], "v") {
			return fields[1], nil
		}
	}
	return "", fmt.Errorf("%s requires no version of %s", gomod, module)
}
