package envs_test

import (
	"context"
	"errors"
	"sort"
	"strings"
	"testing"

	"github.com/gatehouse/gatehouse/internal/agents"
	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/envs"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake"
	"github.com/gatehouse/gatehouse/internal/sandbox/e2bfake/e2bfaketest"
	"github.com/gatehouse/gatehouse/internal/store"
	"github.com/gatehouse/gatehouse/internal/store/storetest"
)

// TestAddTemplateValidation proves each resource and port rule answers on
// its field, defaults are filled, and host environments take no templates.
func TestAddTemplateValidation(t *testing.T) {
	t.Parallel()
	ok := envs.TemplateInput{BackendTemplateID: "base", VCPU: 2, MemoryMB: 512}
	mod := func(fn func(*envs.TemplateInput)) envs.TemplateInput {
		in := ok
		fn(&in)
		return in
	}
	cases := []struct {
		name  string
		in    envs.TemplateInput
		field string
		want  string
	}{
		{"missing id", mod(func(in *envs.TemplateInput) { in.BackendTemplateID = " " }), "backend_template_id", "required"},
		{"long id", mod(func(in *envs.TemplateInput) { in.BackendTemplateID = strings.Repeat("t", 201) }), "backend_template_id", "at most 200"},
		{"zero vcpu", mod(func(in *envs.TemplateInput) { in.VCPU = 0 }), "vcpu", "1 to 256"},
		{"too many vcpu", mod(func(in *envs.TemplateInput) { in.VCPU = 257 }), "vcpu", "1 to 256"},
		{"little memory", mod(func(in *envs.TemplateInput) { in.MemoryMB = 127 }), "memory_mb", "128 MiB"},
		{"huge memory", mod(func(in *envs.TemplateInput) { in.MemoryMB = 1<<20 + 1 }), "memory_mb", "1 TiB"},
		{"negative layer", mod(func(in *envs.TemplateInput) { in.WritableLayerMB = -1 }), "writable_layer_mb", "negative"},
		{"envd port", mod(func(in *envs.TemplateInput) { in.EnvdPort = 65536 }), "envd_port", "1 to 65535"},
		{"agentd port", mod(func(in *envs.TemplateInput) { in.AgentdPort = -5 }), "agentd_port", "1 to 65535"},
		{"probe port", mod(func(in *envs.TemplateInput) { in.ProbePort = 70000 }), "probe_port", "or 0 for none"},
	}
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := setup(t, d)
		ctx := context.Background()
		s := f.mustCreate(t, sandboxInput("cloud", "https://api.e2b.app", "e2b.app", token("s"), "k"))
		h := f.mustCreate(t, hostInput("host", "https://build:49984", token("h")))
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				_, err := f.envs.AddTemplate(ctx, sys, s.ID, tc.in)
				wantField(t, err, tc.field, tc.want)
			})
		}
		t.Run("host refused", func(t *testing.T) {
			t.Parallel()
			_, err := f.envs.AddTemplate(ctx, sys, h.ID, ok)
			wantField(t, err, "environment_id", "sandbox environments")
		})
		t.Run("missing environment", func(t *testing.T) {
			t.Parallel()
			_, err := f.envs.AddTemplate(ctx, sys, 999_999, ok)
			wantKind(t, err, apperr.ErrNotFound, "environment_not_found")
		})
		t.Run("defaults and duplicates", func(t *testing.T) {
			t.Parallel()
			tpl, err := f.envs.AddTemplate(ctx, sys, s.ID, envs.TemplateInput{BackendTemplateID: " dflt ", VCPU: 1, MemoryMB: 128, ProbePort: 8080})
			if err != nil {
				t.Fatal(err)
			}
			if tpl.Name != "dflt" || tpl.BackendTemplateID != "dflt" || tpl.EnvdPort != envs.DefaultEnvdPort ||
				tpl.AgentdPort != envs.DefaultAgentdPort || tpl.ProbePort != 8080 || tpl.BackendStatus != "unknown" || tpl.Ready() {
				t.Errorf("stored %+v", tpl)
			}
			got, err := f.envs.GetTemplate(ctx, sys, tpl.ID)
			if err != nil || got.EnvironmentID != s.ID || got.VCPU != 1 || got.MemoryMB != 128 {
				t.Errorf("GetTemplate = %+v, %v", got, err)
			}
			_, err = f.envs.AddTemplate(ctx, sys, s.ID, envs.TemplateInput{BackendTemplateID: "dflt", VCPU: 1, MemoryMB: 128})
			wantField(t, err, "backend_template_id", "already registered")
		})
	})
}

// TestImportAndDeleteTemplates imports from the fake backend, lists what it
// offers, and refuses to delete a template an agent uses.
func TestImportAndDeleteTemplates(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, d store.Dialect) {
		f := setup(t, d)
		ctx := context.Background()
		fake := e2bfaketest.New(t, agentdBin, e2bfake.Config{Templates: []e2bfake.Template{
			{ID: "base", Aliases: []string{"base"}, CPU: 2, MemoryMB: 512, DiskSizeMB: 1024},
			{ID: "tpl-9f8e", Aliases: []string{"python-ml", "ml"}, CPU: 8, MemoryMB: 16384, DiskSizeMB: 20480},
			{ID: "bare", CPU: 1, MemoryMB: 256},
		}})
		s := f.mustCreate(t, sandboxInput("cloud", fake.URL(), fake.Domain(), e2bfaketest.Token, e2bfaketest.APIKey))
		h := f.mustCreate(t, hostInput("host", "https://build:49984", token("h")))

		offered, err := f.envs.BackendTemplates(ctx, sys, s.ID)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, bt := range offered {
			ids = append(ids, bt.ID)
		}
		sort.Strings(ids)
		if strings.Join(ids, ",") != "bare,base,tpl-9f8e" {
			t.Errorf("BackendTemplates = %v", ids)
		}
		if _, err := f.envs.BackendTemplates(ctx, sys, h.ID); err == nil {
			t.Error("BackendTemplates of a host succeeded")
		}

		ml, err := f.envs.ImportTemplate(ctx, sys, s.ID, "tpl-9f8e")
		if err != nil {
			t.Fatal(err)
		}
		if ml.BackendTemplateID != "tpl-9f8e" || ml.Name != "python-ml" || ml.VCPU != 8 || ml.MemoryMB != 16384 ||
			ml.WritableLayerMB != 20480 || ml.BackendStatus != "ready" || ml.EnvironmentID != s.ID {
			t.Errorf("imported %+v", ml)
		}
		bare, err := f.envs.ImportTemplate(ctx, sys, s.ID, "bare")
		if err != nil {
			t.Fatal(err)
		}
		if bare.Name != "bare" || bare.VCPU != 1 || bare.MemoryMB != 256 {
			t.Errorf("imported %+v", bare)
		}
		_, err = f.envs.ImportTemplate(ctx, sys, s.ID, "tpl-9f8e")
		wantField(t, err, "backend_template_id", "already registered")
		_, err = f.envs.ImportTemplate(ctx, sys, s.ID, "no-such-template")
		wantField(t, err, "backend_template_id", "no template")
		if _, err := f.envs.ImportTemplate(ctx, sys, h.ID, "base"); err == nil {
			t.Error("import into a host succeeded")
		}
		down := f.mustCreate(t, sandboxInput("down", closedURL(t), "e2b.app", e2bfaketest.Token, e2bfaketest.APIKey))
		_, err = f.envs.ImportTemplate(ctx, sys, down.ID, "base")
		wantKind(t, err, apperr.ErrUnavailable, "backend_error")

		list, err := f.envs.Templates(ctx, sys, s.ID)
		if err != nil || len(list) != 2 || list[0].Name != "bare" || list[1].Name != "python-ml" {
			t.Errorf("Templates = %+v, %v", list, err)
		}

		a, err := f.agents.Create(ctx, sys, agents.Input{Name: ptr("ml-agent"), Config: ptr(`{"model":"m"}`),
			SandboxMode: ptr(agents.SandboxPerSession), TemplateID: &ml.ID, EnvironmentIDs: []int64{s.ID}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.envs.DeleteTemplate(ctx, sys, ml.EnvironmentID, ml.ID)
		wantKind(t, err, apperr.ErrConflict, "template_in_use")
		if _, err := f.envs.GetTemplate(ctx, sys, ml.ID); err != nil {
			t.Fatalf("refused delete removed the template: %v", err)
		}
		if _, err := f.envs.DeleteTemplate(ctx, sys, bare.EnvironmentID, bare.ID); err != nil {
			t.Fatalf("delete an unused template: %v", err)
		}
		if _, err := f.agents.Delete(ctx, sys, a.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := f.envs.DeleteTemplate(ctx, sys, ml.EnvironmentID, ml.ID); err != nil {
			t.Fatalf("delete after the agent went: %v", err)
		}
		_, err = f.envs.GetTemplate(ctx, sys, ml.ID)
		if !errors.Is(err, apperr.ErrNotFound) {
			t.Errorf("GetTemplate after delete = %v", err)
		}
		_, err = f.envs.DeleteTemplate(ctx, sys, ml.EnvironmentID, ml.ID)
		wantKind(t, err, apperr.ErrNotFound, "template_not_found")
	})
}
