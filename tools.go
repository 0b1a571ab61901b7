//go:build tools

package tools

import (
	_ "github.com/a-h/templ"
	_ "github.com/casbin/casbin/v2"
	_ "github.com/casbin/gorm-adapter/v3"
	_ "github.com/chromedp/chromedp"
	_ "github.com/coder/websocket"
	_ "github.com/creack/pty"
	_ "github.com/glebarez/sqlite"
	_ "github.com/golang-jwt/jwt/v5"
	_ "github.com/google/uuid"
	_ "github.com/labstack/echo/v4"
	_ "golang.org/x/crypto/argon2"
	_ "gorm.io/driver/postgres"
	_ "gorm.io/gorm"
)
