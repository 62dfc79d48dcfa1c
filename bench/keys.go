package bench

import (
	"math"
	"math/bits"
	"sync"
)

// rng is a worker's random source: wyrand, a 64-bit generator that passes BigCrush, costs a
// multiply and an add, and is not shared (no lock, no atomic).
type rng struct{ s uint64 }

func newRNG(seed uint64) rng { return rng{s: mix64(seed + 0x9e3779b97f4a7c15)} }

func (r *rng) next() uint64 {
	r.s += 0xa0761d6478bd642f
	hi, lo := bits.Mul64(r.s, r.s^0xe7037ed1a0b428db)
	return hi ^ lo
}

// below returns a uniform value in [0, n) (Lemire's multiply-shift; the bias is below 2^-40
// for tables under 2^24 rows and irrelevant for a benchmark).
func (r *rng) below(n uint64) uint64 {
	hi, _ := bits.Mul64(r.next(), n)
	return hi
}

// float returns a uniform value in [0, 1).
func (r *rng) float() float64 { return float64(r.next()>>11) / (1 << 53) }

// mix64 is the splitmix64 finaliser: a bijection of uint64 that scatters neighbouring values.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// zipfTheta is YCSB's default skew.
const zipfTheta = 0.99

// zipf draws ranks in [0, n) with P(rank k) proportional to 1/(k+1)^theta: the generator of
// Gray et al., "Quickly generating billion-record synthetic databases" (as in YCSB). It is
// immutable after newZipf and shared by all workers; each draws with its own rng.
type zipf struct {
	n     uint64
	theta float64
	alpha float64
	zetaN float64
	eta   float64
	half  float64 // 1 + 0.5^theta
}

var zetaCache sync.Map // n -> float64: zeta(n, zipfTheta) costs n math.Pow calls

func zeta(n uint64, theta float64) float64 {
	if theta == zipfTheta {
		if v, ok := zetaCache.Load(n); ok {
			return v.(float64)
		}
	}
	var sum float64
	for i := uint64(1); i <= n; i++ {
		sum += 1 / math.Pow(float64(i), theta)
	}
	if theta == zipfTheta {
		zetaCache.Store(n, sum)
	}
	return sum
}

func newZipf(n uint64, theta float64) *zipf {
	z := &zipf{n: n, theta: theta, alpha: 1 / (1 - theta), zetaN: zeta(n, theta)}
	zeta2 := 1 + math.Pow(0.5, theta)
	z.eta = (1 - math.Pow(2/float64(n), 1-theta)) / (1 - zeta2/z.zetaN)
	z.half = zeta2
	return z
}

// rank draws a rank: 0 is the hottest.
func (z *zipf) rank(r *rng) uint64 {
	u := r.float()
	uz := u * z.zetaN
	if uz < 1 {
		return 0
	}
	if uz < z.half {
		return 1
	}
	k := uint64(float64(z.n) * math.Pow(z.eta*u-z.eta+1, z.alpha))
	return min(k, z.n-1)
}

// scrambled maps a rank to a row index in [0, n): the hot rows are scattered over the table
// (YCSB's ScrambledZipfian), so a hot set is not a hot page.
func (z *zipf) scrambled(r *rng) uint64 {
	return mix64(z.rank(r)) % z.n
}
