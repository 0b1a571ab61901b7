package directory

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/gatehouse/gatehouse/internal/apperr"
	"github.com/gatehouse/gatehouse/internal/store"
)

// Department groups users, agents and environments under owners.
type Department struct {
	ID          int64 `gorm:"primaryKey"`
	Name        string
	Description string
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

// TableName binds Department to its table.
func (Department) TableName() string { return "departments" }

func validateDept(name, desc string) error {
	v := apperr.Validation()
	if name == "" || len(name) > 100 {
		v.Add("name", "Name must be 1 to 100 characters.")
	}
	if len(desc) > 2000 {
		v.Add("description", "Description must be at most 2000 characters.")
	}
	return v.Err()
}

// CreateDepartment adds a department with a unique name.
func (d *Directory) CreateDepartment(ctx context.Context, name, desc string) (Department, error) {
	name, desc = strings.TrimSpace(name), strings.TrimSpace(desc)
	if err := validateDept(name, desc); err != nil {
		return Department{}, err
	}
	now := d.now()
	dep := Department{Name: name, Description: desc, CreatedAt: now, UpdatedAt: now}
	if err := d.DB.WithContext(ctx).Create(&dep).Error; err != nil {
		if store.IsUniqueViolation(err) {
			return Department{}, &apperr.ValidationError{Fields: map[string]string{"name": "A department with this name already exists."}}
		}
		return Department{}, fmt.Errorf("create department: %w", err)
	}
	return dep, nil
}

// ListDepartments returns departments by name; ids, when not nil, limits
// the list to those ids (what a non-admin may see).
func (d *Directory) ListDepartments(ctx context.Context, ids []int64) ([]Department, error) {
	var out []Department
	q := d.DB.WithContext(ctx).Order("name")
	if ids != nil {
		if len(ids) == 0 {
			return out, nil
		}
		q = q.Where("id IN ?", ids)
	}
	if err := q.Find(&out).Error; err != nil {
		return nil, fmt.Errorf("list departments: %w", err)
	}
	return out, nil
}

// GetDepartment returns one department.
func (d *Directory) GetDepartment(ctx context.Context, id int64) (Department, error) {
	return store.ByID[Department](ctx, d.DB, id, "department")
}

// UpdateDepartment changes name and description.
func (d *Directory) UpdateDepartment(ctx context.Context, id int64, name, desc *string) (before, after Department, err error) {
	before, err = d.GetDepartment(ctx, id)
	if err != nil {
		return
	}
	after = before
	if name != nil {
		after.Name = strings.TrimSpace(*name)
	}
	if desc != nil {
		after.Description = strings.TrimSpace(*desc)
	}
	if err = validateDept(after.Name, after.Description); err != nil {
		return
	}
	after.UpdatedAt = d.now()
	err = d.DB.WithContext(ctx).Model(&Department{}).Where("id = ?", id).
		Updates(map[string]any{"name": after.Name, "description": after.Description, "updated_at": after.UpdatedAt}).Error
	if err != nil && store.IsUniqueViolation(err) {
		err = &apperr.ValidationError{Fields: map[string]string{"name": "A department with this name already exists."}}
	}
	return
}

// DeleteDepartment removes a department row. The caller removes its role
// assignments; later issues refuse deletion while agents still belong to it.
func (d *Directory) DeleteDepartment(ctx context.Context, id int64) (Department, error) {
	dep, err := d.GetDepartment(ctx, id)
	if err != nil {
		return dep, err
	}
	if err := d.DB.WithContext(ctx).Delete(&Department{}, id).Error; err != nil {
		if msg := strings.ToLower(err.Error()); strings.Contains(msg, "foreign key") {
			return dep, apperr.New(apperr.ErrConflict, "department_in_use",
				"Department %q still owns agents or environments; move or delete them first.", dep.Name)
		}
		return dep, fmt.Errorf("delete department: %w", err)
	}
	return dep, nil
}
