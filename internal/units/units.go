// Package units writes quantities for people, the same way in status messages
// and in kubectl-aii.
package units

import "fmt"

// Bytes is n in decimal units with one decimal, e.g. "270.6 MB"; below 1000 it
// is a plain count, e.g. "512 B".
func Bytes(n int64) string {
	const unit = 1000
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %cB", float64(n)/float64(div), "kMGTPE"[exp])
}
