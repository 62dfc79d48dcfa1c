//go:build unix

package clustertest

import (
	"fmt"
	"slices"
	"strconv"
)

// CounterTally collects the lines of counter workloads (WorkloadCounter), of any number of
// children and runs, and checks them against the counters' final values (Check). The test's
// goroutine.
//
// The check. Each partition has one counter, starting at 0, that its owner increments by a
// read-modify-write (Table.Update): the value an acknowledged increment wrote is the value
// it read plus one. Under single ownership the increments that committed form one chain
// 1, 2, ..., final, whatever the owner changes, crashes and etcd outages: every committed
// increment read the value the one before it wrote. So, for each partition:
//
//   - every acknowledged value is in 1..final (an acknowledged increment was not lost, nor
//     overwritten by a write of a node that read an older value);
//   - no value was acknowledged twice (two nodes, or one node with a stale cache, that both
//     believed they owned the partition and wrote the same successor: the split brain the
//     fencing exists to prevent);
//   - final is at most the number of increments attempted (nothing wrote a counter but the
//     workloads).
//
// An increment that failed (an "err" line, or a "try" cut short by a kill) may or may not
// have committed: it may account for a value in the chain, never for a duplicate.
type CounterTally struct {
	// Acked lists, per partition, the values acknowledged.
	Acked map[uint32][]uint64
	// Tries counts, per partition, the increments attempted.
	Tries map[uint32]int
	// Errs counts the failures by Class.
	Errs map[string]int
}

// NewCounterTally returns an empty tally.
func NewCounterTally() *CounterTally {
	return &CounterTally{Acked: map[uint32][]uint64{}, Tries: map[uint32]int{}, Errs: map[string]int{}}
}

// CounterLine is one parsed line of a counter workload.
type CounterLine struct {
	Kind  string // try, ok, err; or the line's first word (ready, mark, reopen)
	Part  uint32
	Value uint64 // ok: the value written
	Class string // err: the failure's Class
	Text  string // the whole line
}

// Add parses line into the tally and returns it parsed.
func (c *CounterTally) Add(line string) (CounterLine, error) {
	f := Fields(line)
	l := CounterLine{Text: line}
	if len(f) == 0 {
		return l, fmt.Errorf("clustertest: empty line")
	}
	l.Kind = f[0]
	switch l.Kind {
	case "try", "ok", "err":
	default:
		return l, nil
	}
	if len(f) < 2 || (l.Kind != "try" && len(f) < 3) {
		return l, fmt.Errorf("clustertest: counter line %q", line)
	}
	p, err := strconv.ParseUint(f[1], 10, 32)
	if err != nil {
		return l, fmt.Errorf("clustertest: counter line %q: %w", line, err)
	}
	l.Part = uint32(p)
	switch l.Kind {
	case "try":
		c.Tries[l.Part]++
	case "ok":
		if l.Value, err = strconv.ParseUint(f[2], 10, 64); err != nil {
			return l, fmt.Errorf("clustertest: counter line %q: %w", line, err)
		}
		c.Acked[l.Part] = append(c.Acked[l.Part], l.Value)
	case "err":
		l.Class = f[2]
		c.Errs[l.Class]++
	}
	return l, nil
}

// Check checks partition p's acknowledged increments against its counter's final value (the
// type's doc says what and why); nil when they fit one owner chain.
func (c *CounterTally) Check(p uint32, final uint64) error {
	acked := slices.Clone(c.Acked[p])
	slices.Sort(acked)
	for i, v := range acked {
		if v == 0 || v > final {
			return fmt.Errorf("partition %d: acknowledged value %d not in the final chain 1..%d: an acknowledged increment was lost", p, v, final)
		}
		if i > 0 && acked[i-1] == v {
			return fmt.Errorf("partition %d: value %d acknowledged twice: two writers incremented the same state", p, v)
		}
	}
	if final > uint64(c.Tries[p]) {
		return fmt.Errorf("partition %d: final value %d above the %d increments attempted", p, final, c.Tries[p])
	}
	return nil
}
