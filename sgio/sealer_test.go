package sgio

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

// growingRead is a ReadPages that takes wants until the sender seals it (a merged read).
type growingRead struct {
	mu      sync.Mutex
	rp      ReadPages
	sealed  bool
	encoded bool // AppendBody ran: only after Seal
	early   bool // AppendBody ran before Seal
}

func (g *growingRead) add(w base.PageWant) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.sealed {
		return false
	}
	g.rp.Wants = append(g.rp.Wants, w)
	return true
}

func (g *growingRead) Seal() {
	g.mu.Lock()
	g.sealed = true
	g.mu.Unlock()
}

func (g *growingRead) Type() Type { return TypeReadPages }

func (g *growingRead) BodySize() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.rp.BodySize()
}

func (g *growingRead) AppendBody(dst []byte) []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.encoded, g.early = true, !g.sealed
	return g.rp.AppendBody(dst)
}

func (g *growingRead) Parse([]byte) error { return ErrUnsupported }

func (g *growingRead) Validate() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.rp.Validate()
}

// The sender seals a Sealer when it takes it, before encoding it: wants added until then
// are sent and answered, and none after (Sealer's contract).
func TestClientSealsBeforeEncoding(t *testing.T) {
	c := dialTest(t, newTestServer(t, nil))
	ctx := testCtx(t)
	g := &growingRead{rp: ReadPages{Wants: []base.PageWant{{Table: 1, Page: 0, Want: 1}}}}
	replied := make(chan int, 1)
	require.NoError(t, c.Send(ctx, g, func(f Frame, err error) {
		it, verr := ViewSegments(f.Body)
		if err != nil || verr != nil {
			replied <- -1
			return
		}
		replied <- it.Len()
	}))
	added := 1
	for page := uint64(1); page < 1000 && g.add(base.PageWant{Table: 1, Page: page, Want: 1}); page++ {
		added++
	}
	n := <-replied
	g.mu.Lock()
	defer g.mu.Unlock()
	require.True(t, g.sealed)
	require.True(t, g.encoded)
	require.False(t, g.early, "encoded before it was sealed")
	require.Equal(t, len(g.rp.Wants), n, "the reply answers every want sent")
	require.Equal(t, added, n)
}
