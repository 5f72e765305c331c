// Command gen prints the reasons table of docs/failure-reasons.md.
package main

import (
	"fmt"

	"github.com/aiinference/operator/internal/reasons"
)

func main() { fmt.Print(reasons.MarkdownTable()) }
