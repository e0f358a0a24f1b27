package engine_test

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// The .dynsym/.dynstr bounds left .gnu.version
// (SHT_GNU_VERSYM) unbounded, which DynamicSymbols reads whole (1.3 GiB
// allocated for a 29 KB bundle): the version sections are bounded too.
func writeVersymBomb(t *testing.T, path string, versym int64) {
	t.Helper()
	machine := elf.EM_X86_64
	if runtime.GOARCH == "arm64" {
		machine = elf.EM_AARCH64
	}
	const ehsize, shentsize = 64, 64
	dynstr := []byte("\x00")
	shstr := []byte("\x00.dynsym\x00.dynstr\x00.shstrtab\x00.gnu.version\x00")
	dynstrOff := int64(ehsize)
	shstrOff := dynstrOff + int64(len(dynstr))
	dynsymOff := (shstrOff + int64(len(shstr)) + 7) &^ 7
	const dynsym = 24 * 2
	shOff := (dynsymOff + dynsym + 7) &^ 7
	versymOff := (shOff + 5*shentsize + 4095) &^ 4095
	var b bytes.Buffer
	le := binary.LittleEndian
	hdr := elf.Header64{Type: uint16(elf.ET_DYN), Machine: uint16(machine), Version: uint32(elf.EV_CURRENT),
		Shoff: uint64(shOff), Ehsize: ehsize, Shentsize: shentsize, Shnum: 5, Shstrndx: 3}
	copy(hdr.Ident[:], elf.ELFMAG)
	hdr.Ident[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	hdr.Ident[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	hdr.Ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	binary.Write(&b, le, hdr)
	b.Write(dynstr)
	b.Write(shstr)
	b.Write(make([]byte, dynsymOff-int64(b.Len())))
	b.Write(make([]byte, dynsym))
	b.Write(make([]byte, shOff-int64(b.Len())))
	for _, s := range []elf.Section64{
		{},
		{Name: 1, Type: uint32(elf.SHT_DYNSYM), Flags: uint64(elf.SHF_ALLOC), Off: uint64(dynsymOff), Size: dynsym, Link: 2, Info: 1, Addralign: 8, Entsize: 24},
		{Name: 9, Type: uint32(elf.SHT_STRTAB), Flags: uint64(elf.SHF_ALLOC), Off: uint64(dynstrOff), Size: uint64(len(dynstr)), Addralign: 1},
		{Name: 17, Type: uint32(elf.SHT_STRTAB), Off: uint64(shstrOff), Size: uint64(len(shstr)), Addralign: 1},
		{Name: 27, Type: uint32(elf.SHT_GNU_VERSYM), Flags: uint64(elf.SHF_ALLOC), Off: uint64(versymOff), Size: uint64(versym), Link: 1, Addralign: 2, Entsize: 2},
	} {
		binary.Write(&b, le, s)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, versymOff+versym); err != nil {
		t.Fatal(err)
	}
}

func TestDeployELFCheckBoundsSymbolVersions(t *testing.T) {
	const versym = 256 << 20
	m := testkit.Manifest("bomb")
	dir := t.TempDir()
	writeVersymBomb(t, filepath.Join(dir, m.Library), versym)
	testkit.WriteManifest(t, dir, m)
	b, _, _, err := bundle.PackBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	e := testkit.Engine(t, engine.Config{})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err = e.Control().Deploy(context.Background(), m.Name, bytes.NewReader(b), false)
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("bundle %d bytes; deploy: %v; allocated %d MiB", len(b), err, alloc>>20)
	if alloc > 128<<20 {
		t.Errorf("a %d-byte bundle whose library has a %d MiB .gnu.version made the server allocate %d MiB", len(b), versym>>20, alloc>>20)
	}
}
