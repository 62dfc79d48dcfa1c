package txnode_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGuideSnippetsCompile checks that every Go block of docs/getting-started.md is a run of
// consecutive lines of example_guide_test.go (compared without indentation), so that the
// guide's code is code that compiles and runs as an Example.
func TestGuideSnippetsCompile(t *testing.T) {
	guide, err := os.ReadFile("../docs/getting-started.md")
	require.NoError(t, err)
	src, err := os.ReadFile("example_guide_test.go")
	require.NoError(t, err)
	var code []string
	for _, l := range strings.Split(string(src), "\n") {
		code = append(code, strings.TrimSpace(l))
	}
	blocks := 0
	for rest := string(guide); ; {
		_, after, ok := strings.Cut(rest, "```go\n")
		if !ok {
			break
		}
		block, tail, ok := strings.Cut(after, "```")
		require.True(t, ok, "unterminated code block")
		rest = tail
		blocks++
		var lines []string
		for _, l := range strings.Split(strings.TrimRight(block, "\n"), "\n") {
			lines = append(lines, strings.TrimSpace(l))
		}
		require.True(t, containsRun(code, lines), "guide block %d is not in example_guide_test.go:\n%s", blocks, block)
	}
	require.GreaterOrEqual(t, blocks, 8, "the guide's Go blocks")
}

func containsRun(code, lines []string) bool {
	for i := 0; i+len(lines) <= len(code); i++ {
		match := true
		for j, l := range lines {
			if code[i+j] != l {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}
