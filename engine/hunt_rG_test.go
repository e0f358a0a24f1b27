package engine_test

// Hunt rG (a hostile bundle author against a node): tests that fail on the
// code as found, each showing one defect. They are evidence, not fixes.

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// writeSymbolBomb writes path: a 64-bit little-endian ELF shared object for
// this machine whose .dynsym section is dynsym bytes of zeros (null
// symbols), the file sparse where the section lies. Nothing else in it
// matters: the deploy's static check reads the whole section before it
// looks at a symbol.
func writeSymbolBomb(t *testing.T, path string, dynsym int64) {
	t.Helper()
	machine := elf.EM_X86_64
	if runtime.GOARCH == "arm64" {
		machine = elf.EM_AARCH64
	}
	const ehsize, shentsize = 64, 64
	dynstr := []byte("\x00")
	shstr := []byte("\x00.dynsym\x00.dynstr\x00.shstrtab\x00")
	dynstrOff := int64(ehsize)
	shstrOff := dynstrOff + int64(len(dynstr))
	shOff := (shstrOff + int64(len(shstr)) + 7) &^ 7
	dynsymOff := (shOff + 4*shentsize + 4095) &^ 4095

	var b bytes.Buffer
	le := binary.LittleEndian
	hdr := elf.Header64{Type: uint16(elf.ET_DYN), Machine: uint16(machine), Version: uint32(elf.EV_CURRENT),
		Shoff: uint64(shOff), Ehsize: ehsize, Shentsize: shentsize, Shnum: 4, Shstrndx: 3}
	copy(hdr.Ident[:], elf.ELFMAG)
	hdr.Ident[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	hdr.Ident[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	hdr.Ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	binary.Write(&b, le, hdr)
	b.Write(dynstr)
	b.Write(shstr)
	b.Write(make([]byte, shOff-int64(b.Len())))
	for _, s := range []elf.Section64{
		{},
		{Name: 1, Type: uint32(elf.SHT_DYNSYM), Flags: uint64(elf.SHF_ALLOC), Off: uint64(dynsymOff), Size: uint64(dynsym), Link: 2, Info: 1, Addralign: 8, Entsize: 24},
		{Name: 9, Type: uint32(elf.SHT_STRTAB), Flags: uint64(elf.SHF_ALLOC), Off: uint64(dynstrOff), Size: uint64(len(dynstr)), Addralign: 1},
		{Name: 17, Type: uint32(elf.SHT_STRTAB), Off: uint64(shstrOff), Size: uint64(len(shstr)), Addralign: 1},
	} {
		binary.Write(&b, le, s)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, dynsymOff+dynsym); err != nil { // the section: zeros, sparse
		t.Fatal(err)
	}
}

// TestHuntRGDeployELFCheckBoundsServerMemory: a deploy's static check of
// the library (engine/control.go checkDeploy -> loader.CheckBundle ->
// loader.Inspect, in the server process) calls debug/elf's
// DynamicSymbols, which reads the whole .dynsym section into memory and
// makes an elf.Symbol (72 bytes) of every 24-byte entry: about 4 bytes of
// heap per byte of the section, bounded only by the 4 GiB a bundle may
// unpack to. A section of zeros compresses to nearly nothing, so a deploy
// of a few hundred KiB makes the server allocate 16+ GiB at once (OOM on
// most nodes; every deploy in parallel adds as much). Here a 256 MiB
// section, a bundle of well under a MiB, costs the server over a GiB.
func TestHuntRGDeployELFCheckBoundsServerMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates about 1.3 GiB on the code as found")
	}
	const dynsym = 24 * (256 << 20 / 24) // whole entries
	m := testkit.Manifest("bomb")
	dir := t.TempDir()
	writeSymbolBomb(t, filepath.Join(dir, m.Library), dynsym)
	testkit.WriteManifest(t, dir, m)
	b, _, _, err := bundle.PackBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	e := testkit.Engine(t, engine.Config{})

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	peak := make(chan uint64)
	done := make(chan struct{})
	go func() { // the live heap's high-water mark while the deploy runs
		var top uint64
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			top = max(top, ms.HeapAlloc)
			select {
			case <-done:
				peak <- top
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	_, err = e.Control().Deploy(context.Background(), m.Name, bytes.NewReader(b), false)
	close(done)
	top := <-peak
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("deploy of a %d-byte bundle (a library with a %d MiB .dynsym): %v; the server allocated %d MiB meanwhile, its live heap peaking at %d MiB (from %d MiB)",
		len(b), dynsym>>20, err, alloc>>20, top>>20, before.HeapAlloc>>20)
	if err == nil {
		t.Fatal("the symbol bomb was accepted")
	}
	// Spooling, unpacking and hashing stream through fixed buffers (the
	// zstd window included): a deploy of a valid bundle with 256 MiB of
	// constants allocates 9 MiB in all here.
	if alloc > 128<<20 {
		t.Errorf("a deploy of %d bytes made the server allocate %d MiB: the library's dynamic symbol table is read whole and expanded, bounded only by the unpacked size (4 GiB: 16+ GiB of heap)", len(b), alloc>>20)
	}
}
