package model

// RNG is splitmix64. The trainer's determinism must not depend on the Go
// release, and math/rand's streams and shuffles are not promised stable
// across releases; this one is fixed by its few lines.
type RNG struct{ state uint64 }

// NewRNG seeds a generator.
func NewRNG(seed uint64) *RNG { return &RNG{state: seed} }

// Uint64 returns the next value.
func (r *RNG) Uint64() uint64 {
	r.state += 0x9e3779b97f4a7c15
	z := r.state
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// Float32 is uniform in [0, 1).
func (r *RNG) Float32() float32 { return float32(r.Uint64()>>40) / (1 << 24) }

// Intn is in [0, n); the modulo bias is below 2^-40 for the n used here.
func (r *RNG) Intn(n int) int { return int(r.Uint64() % uint64(n)) }

// Shuffle permutes idx (Fisher–Yates).
func (r *RNG) Shuffle(idx []int) {
	for i := len(idx) - 1; i > 0; i-- {
		j := r.Intn(i + 1)
		idx[i], idx[j] = idx[j], idx[i]
	}
}

// Init returns parameters drawn uniformly from (-0.5, 0.5], CUDA-CNN's
// initialisation (0.5 - rand()/RAND_MAX), from r.
func Init(r *RNG) *Params {
	p := new(Params)
	for i, f := 0, p.floats(); i < len(f); i++ {
		f[i] = 0.5 - r.Float32()
	}
	return p
}

// Sample is one labelled training image.
type Sample struct {
	Image *[Pixels]float32
	Label int
}

// Epoch runs one epoch of per-sample SGD over train in an order drawn from
// r, and returns the mean loss and the number of samples the network
// classified correctly before its update.
func (p *Params) Epoch(train []Sample, lr float32, r *RNG) (meanLoss float64, correct int) {
	order := make([]int, len(train))
	for i := range order {
		order[i] = i
	}
	r.Shuffle(order)
	var a Activations
	g := new(Params)
	var loss float64
	for _, i := range order {
		s := train[i]
		p.Forward(s.Image, &a)
		if Argmax(a.Out) == s.Label {
			correct++
		}
		loss += p.Backward(s.Image, &a, s.Label, g)
		p.Step(g, lr)
	}
	if len(train) > 0 {
		loss /= float64(len(train))
	}
	return loss, correct
}
