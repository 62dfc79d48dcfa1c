package txnode

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDocsCloseEveryOpen: every snippet and example that opens a DB closes it with
// `defer db.Close(ctx)` right after (in WriteBack a forgotten Close loses the unflushed
// commits silently), and Options' doc says what a crash or a missing Close loses.
func TestDocsCloseEveryOpen(t *testing.T) {
	files := []string{"../README.md", "doc.go", "example_test.go"}
	examples, err := filepath.Glob("../examples/*/*.go")
	require.NoError(t, err)
	require.NotEmpty(t, examples)
	files = append(files, examples...)
	opens := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		lines := strings.Split(string(b), "\n")
		for i, l := range lines {
			if !strings.Contains(l, "txnode.Open(") && !strings.Contains(l, ":= openExample()") {
				continue
			}
			if strings.HasPrefix(strings.TrimSpace(l), "func ") || strings.Contains(l, "db, err = txnode.Open(") {
				continue // openExample itself: its callers defer the Close
			}
			opens++
			next := strings.Join(lines[i+1:min(i+6, len(lines))], "\n")
			require.Contains(t, next, "defer db.Close(ctx)", "%s:%d opens a DB without `defer db.Close(ctx)` after it", f, i+1)
		}
	}
	require.GreaterOrEqual(t, opens, 6, "the snippets were found")
	b, err := os.ReadFile("options.go")
	require.NoError(t, err)
	for _, want := range []string{"without DB.Close", "- Durable: nothing that returned nil", "- WriteBack: every commit not yet flushed"} {
		require.Contains(t, string(b), want, "Options' doc says what a crash or a missing Close loses")
	}
}
