variable "name" {
  description = "Identifier of the RDS instance and prefix of its companions."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,40}$", var.name))
    error_message = "name must be 3-41 characters of lowercase letters, digits and dashes, starting with a letter."
  }
}

variable "engine_version" {
  description = "PostgreSQL <major>.<minor> (16 or newer)."
  type        = string

  validation {
    condition     = can(regex("^(1[6-9])\\.[0-9]+$", var.engine_version))
    error_message = "engine_version must be PostgreSQL 16 or newer, as <major>.<minor>."
  }
}

variable "instance_class" {
  description = "RDS instance class, e.g. db.t4g.medium (dev) or db.r7g.large (prod)."
  type        = string

  validation {
    condition     = can(regex("^db\\.[a-z0-9]+\\.[0-9]*x?(micro|small|medium|large)$", var.instance_class))
    error_message = "instance_class must be an RDS class such as db.r7g.large."
  }
}

variable "allocated_storage_gb" {
  description = "Initial storage; autoscaling may grow it to 4x."
  type        = number

  validation {
    condition     = var.allocated_storage_gb >= 20 && var.allocated_storage_gb <= 16384
    error_message = "allocated_storage_gb must be 20-16384."
  }
}

variable "multi_az" {
  description = "Standby replica in another zone with automatic failover (prod)."
  type        = bool
}

variable "deletion_protection" {
  description = "Refuse to delete the instance (prod); a final snapshot is taken either way."
  type        = bool
}

variable "backup_retention_days" {
  description = "Days of automated backups, the window for point-in-time restore."
  type        = number

  validation {
    condition     = var.backup_retention_days >= 1 && var.backup_retention_days <= 35
    error_message = "backup_retention_days must be 1-35 (0 would turn backups off)."
  }
}

variable "max_connections" {
  description = "PostgreSQL max_connections, sized from the platform's connection pools (see the stack)."
  type        = number

  validation {
    condition     = var.max_connections >= 50 && var.max_connections <= 5000
    error_message = "max_connections must be 50-5000."
  }
}

variable "password_rotation_days" {
  description = "Days between rotations of the RDS-managed master password (the platform must be restarted after one; see the runbook)."
  type        = number

  validation {
    condition     = var.password_rotation_days >= 1 && var.password_rotation_days <= 365
    error_message = "password_rotation_days must be 1-365."
  }
}

variable "vpc_id" {
  description = "VPC of the database."
  type        = string

  validation {
    condition     = can(regex("^vpc-[0-9a-f]+$", var.vpc_id))
    error_message = "vpc_id must be a VPC ID (vpc-...)."
  }
}

variable "subnet_group_name" {
  description = "RDS subnet group (the network module's database subnets)."
  type        = string

  validation {
    condition     = length(var.subnet_group_name) > 0 && length(var.subnet_group_name) <= 255
    error_message = "subnet_group_name must be 1-255 characters."
  }
}

variable "client_security_group_id" {
  description = "Security group of the EKS nodes, the only one allowed to connect."
  type        = string

  validation {
    condition     = can(regex("^sg-[0-9a-f]+$", var.client_security_group_id))
    error_message = "client_security_group_id must be a security group ID (sg-...)."
  }
}

variable "log_retention_days" {
  description = "Days to keep the exported PostgreSQL logs."
  type        = number

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days must be a retention CloudWatch accepts (1, 3, 5, 7, 14, 30, 60, 90, ...)."
  }
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)

  validation {
    condition     = alltrue([for k, v in var.tags : length(k) > 0 && length(k) <= 128 && length(v) <= 256])
    error_message = "tags need keys of 1-128 and values of at most 256 characters (AWS limits)."
  }
}
